"""What was repaired or capped: the ``ParsedMessage.notes`` collector, and
the cleaning every returned string goes through (no NULs, no lone
surrogates: Postgres ``text`` and ``jsonb`` reject both)."""

from __future__ import annotations

from .limits import MAX_NOTES


class Notes:
    """Collects the notes of one parse, in order, without duplicates; past
    ``MAX_NOTES`` - 1 it only counts, and ``result()`` says how many more
    there were. One per parse: not shared between threads."""

    __slots__ = ("_dropped", "_notes")

    def __init__(self) -> None:
        self._notes: list[str] = []
        self._dropped = 0

    def add(self, text: str) -> None:
        if len(self._notes) < MAX_NOTES - 1:
            text = clean(text)
            if text not in self._notes:
                self._notes.append(text)
        else:
            self._dropped += 1

    def result(self) -> tuple[str, ...]:
        if self._dropped:
            return (*self._notes, f"{self._dropped} more notes omitted")
        return tuple(self._notes)


def clean(text: str) -> str:
    """Remove NUL characters and lone surrogates (Postgres rejects both).
    Decoding already removed surrogates (see charsets.Codec.surrogate_free);
    this is the second line of defence for the short fields."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def without_nul(text: str) -> str:
    """For the long fields, made of decoded text only: decoding removed the
    surrogates already, and checking 1 MB again is not free."""
    return text.replace("\x00", "") if "\x00" in text else text


def quote(value: str, limit: int = 60) -> str:
    """A value for a note: short, single-line, cleaned."""
    value = " ".join(clean(value).split())
    if len(value) > limit:
        value = value[:limit] + "…"
    return "'" + value + "'"
