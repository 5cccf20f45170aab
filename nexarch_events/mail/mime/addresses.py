"""Address headers (From, To, Cc): display names and addresses.

The common forms ('Name <a@b>', '"Last, First" <a@b>', 'a@b') take one
regular expression; anything else (comments, group syntax, obsolete source
routes, broken quoting) is tokenised and read leniently. Never raises: an
item with neither a name nor an address is dropped."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .headers import QUOTED_PAIR, Fields, decode_words, header_text, unquote
from .limits import MAX_NAME_CHARS
from .notes import Notes, clean

__all__ = ["Address", "addresses", "parse_address", "simple_addresses",
           "split_address_list"]

# Possessive throughout (no part gives back what it took): with a lazy
# display name between two runs of optional blanks, a value of blanks that
# does not match tried every way to share them out, cubic in their number
# (4,000 spaces in a From field: 35 s, holding the GIL; a fuzzing audit). A
# name's trailing blanks are now part of it, and removed where it is used.
_SIMPLE_ADDRESS = re.compile(
    r'[ \t]*+(?:(?:"((?:[^"\\\x00]|\\[^\x00])*+)"|([^"<>()\[\],;:@\\\x00]*+))[ \t]*+'
    r'<([^<>\s,;:"()\[\]\\\x00]++)>'
    r'|([^\s<>()\[\],;:"\\\x00@]++@[^\s<>()\[\],;:"\\\x00]++))?'
    r'[ \t]*+(?:,|\Z)')
_ADDRESS_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.?)*"?|\((?:[^()\\]|\\.?)*\)?|<[^<>]*>?|[^,"(<]+|,|.', re.S)


@dataclass(frozen=True, slots=True)
class Address:
    #: Decoded display name ("" if none).
    name: str
    #: As written, e.g. "Anna.Muster@Example.org" ("" if unparseable).
    address: str

    def display(self) -> str:
        """The display form: name and <address>, or whichever of them exists."""
        if self.name and self.address:
            return f"{self.name} <{self.address}>"
        return self.name or self.address


def addresses(fields: Fields, field_name: bytes, notes: Notes) -> tuple[Address, ...]:
    """Every address of every ``field_name`` (lower case) field, in order."""
    values = fields.get(field_name)
    if not values:
        return ()
    label = field_name.decode().title()
    result: list[Address] = []
    for value in values:
        text = header_text(value, label, notes)
        simple = simple_addresses(text)
        if simple is None:
            for tokens in split_address_list(text):
                parsed = parse_address(tokens, label, notes)
                if parsed is not None:
                    result.append(parsed)
            continue
        for name, address in simple:
            if "=?" in name:
                name = clean(" ".join(decode_words(name, f"header {label}", notes).split()))
            result.append(Address(name=name[:MAX_NAME_CHARS],
                                  address=address[:MAX_NAME_CHARS]))
    return tuple(result)


def parse_address(tokens: list[str], label: str, notes: Notes) -> Address | None:
    """One address from its tokens (quoted strings, comments, <angle>,
    plain text). Group syntax ("team: a@b, c@d;") is flattened."""
    name_parts: list[str] = []
    comments: list[str] = []
    angle: str | None = None
    spec_parts: list[str] = []
    for token in tokens:
        c = token[0]
        if c == '"':
            name_parts.append(unquote(token))
            spec_parts.append(token)
        elif c == "(":
            comments.append((token[1:-1] if token.endswith(")") else token[1:]).strip())
        elif c == "<":
            angle = token[1:-1] if token.endswith(">") else token[1:]
        else:
            text = token
            if ":" in text and angle is None and "@" not in text.partition(":")[0]:
                # "group name:" starts a group; what precedes is its name.
                text = text.rpartition(":")[2]
                name_parts.clear()
                spec_parts.clear()
            text = text.replace(";", " ")
            if angle is None:
                name_parts.append(text)
                spec_parts.append(text)
    comment = " ".join(c for c in comments if c)
    if angle is not None:
        address = "".join(angle.split())
        if ":" in address:  # obsolete source route "@a,@b:user@host"
            address = address.rpartition(":")[2]
        name = " ".join(" ".join(name_parts).split()) or comment
    else:
        spec = "".join("".join(spec_parts).split())
        if "@" in spec:
            address, name = spec, comment
        else:
            address = ""
            name = " ".join(" ".join(name_parts).split()) or comment
    if name:
        name = clean(" ".join(decode_words(name, f"header {label}", notes).split()))
    address = clean(address)
    if not name and not address:
        return None
    return Address(name=name[:MAX_NAME_CHARS], address=address[:MAX_NAME_CHARS])


def simple_addresses(value: str) -> list[tuple[str, str]] | None:
    """The common forms only ('Name <a@b>', '"Last, First" <a@b>', 'a@b'),
    as (name, address) pairs; None if anything else is in the list."""
    result = []
    pos = 0
    end = len(value)
    match = _SIMPLE_ADDRESS.match
    while pos < end:
        m = match(value, pos)
        if m is None:
            return None
        pos = m.end()
        quoted, plain, angle, bare = m.groups()
        if bare is not None:
            result.append(("", bare))
        elif angle is not None:
            if quoted is not None:
                name = QUOTED_PAIR.sub(r"\1", quoted) if "\\" in quoted else quoted
            else:
                name = plain or ""
            result.append((" ".join(name.split()), angle))
        elif not m.group(0).strip(", \t"):
            continue  # an empty item (", ,")
        else:
            return None
    return result


def split_address_list(value: str) -> list[list[str]]:
    """Tokens of each comma-separated item of an address list (commas inside
    quotes, comments and angle brackets do not separate)."""
    items: list[list[str]] = []
    current: list[str] = []
    for token in _ADDRESS_TOKEN.findall(value):
        if token == ",":
            if current:
                items.append(current)
            current = []
        elif not token.isspace():
            current.append(token)
    if current:
        items.append(current)
    return items
