"""Sample mail for the demo and for tests: short business messages in
English and German, plain text or multipart (text + HTML alternative, or
text + a small CSV attachment), with valid RFC 5322 headers.

Every message carries a word no other message has (``SampleMail.token``, in
its body as a reference number), so a search for it finds exactly that
message. Deterministic for a seeded ``random.Random`` and a fixed
``sent_at``; no I/O.
"""

from __future__ import annotations

import random
import string
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Literal

__all__ = ["SampleMail", "sample_mail", "sample_mails"]

Language = Literal["en", "de"]

_PEOPLE = (
    ("Jana Keller", "jana.keller", "keller-logistik.example"),
    ("Jürgen Weiß", "j.weiss", "weiss-bau.example"),
    ("Anna Schmidt", "anna", "schmidt-partner.example"),
    ("Lukas Böhm", "lukas.boehm", "northwind.example"),
    ("Emily Carter", "emily", "carter-design.example"),
    ("Tom Okafor", "tom.okafor", "brightline.example"),
    ("Priya Nair", "priya", "harbour-freight.example"),
    ("Sofia Rossi", "s.rossi", "lumen-studio.example"),
)

#: Things: (noun, its accusative article, "about the"/"zur"/"zum").
_THINGS: dict[Language, tuple[tuple[str, str, str], ...]] = {
    "en": tuple((noun, "the", "about the") for noun in (
        "invoice", "offer", "contract", "delivery", "order", "report", "budget", "schedule",
        "proposal", "shipment")),
    "de": (("Rechnung", "die", "zur"), ("Angebot", "das", "zum"), ("Vertrag", "den", "zum"),
           ("Lieferung", "die", "zur"), ("Bestellung", "die", "zur"), ("Bericht", "den", "zum"),
           ("Zahlung", "die", "zur"), ("Kalkulation", "die", "zur"), ("Auftrag", "den", "zum")),
}

_WORDS: dict[Language, dict[str, tuple[str, ...]]] = {
    "en": {
        "project": ("website relaunch", "warehouse move", "spring campaign", "office fit-out",
                    "supplier audit", "Q3 forecast"),
        "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"),
        "subject": ("{Thing} for the {project}", "Question {about} {thing}",
                    "Re: {Thing} {number}", "Updated {thing} – {project}",
                    "Meeting on {day} about the {project}"),
        "sentence": ("Could you send me {the} {thing} for the {project} by {day}?",
                     "I have put {the} {thing} into our shared folder.",
                     "We reviewed {the} {thing} and have two small changes.",
                     "Please check the figures by {day}.",
                     "Thanks for the quick reply about the {project}.",
                     "Let us talk about {the} {thing} on {day}."),
        "hello": ("Hi {first},", "Hello {first},", "Dear {first},"),
        "bye": ("Best regards", "Thanks", "Kind regards", "Cheers"),
        "ref": ("Reference",),
    },
    "de": {
        "project": ("Umzug Lager Süd", "Neubau Halle 3", "Messe Köln", "Website-Relaunch",
                    "Jahresabschluss", "Büroumbau"),
        "day": ("Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag"),
        "subject": ("{Thing} zum Projekt {project}", "Frage {about} {thing}",
                    "AW: {Thing} {number}", "Neue Version: {Thing} {number}",
                    "Besprechung am {day}: {project}"),
        "sentence": ("Könnten Sie mir bitte {the} {thing} bis {day} schicken?",
                     "Anbei {the} {thing}, wie besprochen.",
                     "Wir haben {the} {thing} geprüft und noch zwei kleine Änderungen.",
                     "Bitte prüfen Sie die Zahlen bis {day}.",
                     "Vielen Dank für die schnelle Rückmeldung zum Projekt {project}.",
                     "Lassen Sie uns am {day} über {the} {thing} sprechen."),
        "hello": ("Hallo {first},", "Guten Tag {first},", "Liebe Kolleginnen und Kollegen,"),
        "bye": ("Viele Grüße", "Mit freundlichen Grüßen", "Beste Grüße", "Danke und Gruß"),
        "ref": ("Vorgangsnummer",),
    },
}

_TOKEN_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True, slots=True)
class SampleMail:
    #: The message as a server stores it (CRLF line ends).
    raw: bytes
    #: The word only this message contains ("ref" + 10 letters/digits).
    token: str
    subject: str
    #: The thing it is about ("invoice", "Angebot"): a word for a search with many hits.
    topic: str
    #: "Name <address>" of the From header.
    sender: str
    language: Language
    #: "plain", "alternative" (text + HTML) or "attachment" (text + CSV).
    kind: str


def _token(rng: random.Random) -> str:
    # Letters first, so that the text-search parser reads one word, never a number.
    return "ref" + "".join(rng.choices(_TOKEN_ALPHABET, k=10))


def sample_mail(rng: random.Random | None = None, *,
                sent_at: datetime | None = None) -> SampleMail:
    """One sample message. ``rng`` picks everything (default: a fresh,
    unseeded one); ``sent_at`` is its Date (default: now, UTC)."""
    rng = rng or random.Random()
    sent_at = sent_at or datetime.now(UTC)
    language: Language = rng.choice(("en", "de"))
    words = _WORDS[language]
    (from_name, from_user, from_domain), (to_name, to_user, to_domain) = rng.sample(_PEOPLE, 2)
    token = _token(rng)
    thing, the, about = rng.choice(_THINGS[language])
    fill = {"thing": thing, "Thing": thing[:1].upper() + thing[1:], "the": the, "about": about,
            "project": rng.choice(words["project"]), "day": rng.choice(words["day"]),
            "number": str(rng.randint(1000, 9999)), "first": to_name.split()[0]}
    subject = rng.choice(words["subject"]).format(**fill)
    # One sentence at least names the topic, so that searching for it finds the message.
    about_it = rng.choice([s for s in words["sentence"] if "{thing}" in s])
    chosen = [about_it, *rng.sample([s for s in words["sentence"] if s != about_it],
                                    rng.randint(1, 3))]
    rng.shuffle(chosen)
    sentences = [s.format(**fill) for s in chosen]
    text = "\n".join([
        rng.choice(words["hello"]).format(**fill), "",
        textwrap.fill(" ".join(sentences), width=72), "",
        f"{words['ref'][0]}: {token}", "",
        rng.choice(words["bye"]),
        from_name.split()[0], ""])

    message = EmailMessage(policy=policy.SMTP)
    sender = Address(from_name, from_user, from_domain)
    message["From"] = sender
    message["To"] = Address(to_name, to_user, to_domain)
    message["Subject"] = subject
    message["Date"] = format_datetime(sent_at)
    message["Message-ID"] = f"<{token}@{from_domain}>"
    # Quoted-printable keeps the message 7-bit clean, as RFC 5322 mail should be.
    cte = "7bit" if text.isascii() else "quoted-printable"
    message.set_content(text, cte=cte)
    kind = rng.choice(("plain", "plain", "alternative", "attachment"))
    if kind == "alternative":
        paragraphs = "".join(f"<p>{line}</p>" for line in text.split("\n") if line)
        message.add_alternative(f"<html><body>{paragraphs}</body></html>\n", subtype="html",
                                cte=cte)
    elif kind == "attachment":
        rows = "\n".join(f"{n};{rng.choice(_THINGS[language])[0]};{rng.randint(10, 5000)},00"
                         for n in range(1, rng.randint(3, 6)))
        message.add_attachment(f"pos;item;amount\n{rows}\n", subtype="csv",
                               filename=f"{thing.lower()}-{fill['number']}.csv")
    if message.is_multipart():
        # The generator would pick a boundary from the global random state.
        message.set_boundary(f"=_part_{token}")
    return SampleMail(raw=message.as_bytes(), token=token, subject=subject, topic=thing,
                      sender=str(sender), language=language, kind=kind)


def sample_mails(count: int, *, seed: int | str | None = None,
                 sent_at: datetime | None = None) -> list[SampleMail]:
    """``count`` sample messages, reproducible for a given ``seed`` and ``sent_at``."""
    rng = random.Random(seed)
    return [sample_mail(rng, sent_at=sent_at) for _ in range(count)]
