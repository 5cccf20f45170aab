"""archive -> reindex -> search -> verify-index, through the command line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.test_cli import cli
from tests.support.mailgen import realistic_messages, unique_token


def test_archive_reindex_search_verify(database_url: str, tmp_path: Path) -> None:
    files = []
    for n, raw in enumerate(realistic_messages(5, seed=21)):
        path = tmp_path / f"m{n}.eml"
        path.write_bytes(raw)
        files.append(str(path))
    archived = cli("archive", "--tenant", "acme", *files, url=database_url)
    assert archived.returncode == 0, archived.stderr
    assert archived.stdout.count("\tarchived\t") == 5
    # It says what makes the mail searchable (the workers index it).
    assert "5 message(s) queued for indexing" in archived.stderr
    assert "run` or `" in archived.stderr and "worker` is running" in archived.stderr
    again = cli("archive", "--tenant", "acme", files[0], url=database_url)
    assert "already archived" in again.stdout

    # No worker ran yet: the index is behind the archive.
    behind = cli("verify-index", "--tenant", "acme", url=database_url)
    assert behind.returncode == 1 and "5 missing" in behind.stdout

    rebuilt = cli("reindex", "--tenant", "acme", url=database_url)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "5 message(s) indexed" in rebuilt.stdout
    assert "reindex acme [" in rebuilt.stderr  # the progress bar

    found = cli("search", "--tenant", "acme", "--json", unique_token(2), url=database_url)
    assert found.returncode == 0, found.stderr
    result = json.loads(found.stdout)
    assert result["total"] == 1 and len(result["hits"]) == 1
    assert (result["exact_total"], result["ignored"]) == (True, [])
    assert "<mark>" in result["hits"][0]["snippet"]

    # Archived from files: no server received date, so outside every
    # received-date range, and listed (last) when sorting by it.
    received = cli("search", "--tenant", "acme", "--json", "--sort", "received",
                   "--received-since", "2000-01-01", unique_token(2), url=database_url)
    assert received.returncode == 0, received.stderr
    assert json.loads(received.stdout)["total"] == 0
    by_received = cli("search", "--tenant", "acme", "--json", "--sort", "received", "",
                      url=database_url)
    listed = json.loads(by_received.stdout)
    assert listed["total"] == 5 and {h["received_at"] for h in listed["hits"]} == {None}

    other = cli("search", "--tenant", "other", "--json", unique_token(2), url=database_url)
    assert json.loads(other.stdout)["total"] == 0

    text = cli("search", "--tenant", "acme", unique_token(3), url=database_url)
    assert text.returncode == 0 and text.stdout.startswith("1 match(es)")
    dropped = cli("search", "--tenant", "acme", f"{unique_token(3)} ²", url=database_url)
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.splitlines()[:2] == [
        "1 match(es), showing 1-1", "ignored (nothing searchable in them): '²'"]

    bad = cli("search", "--tenant", "acme", "!! )(", url=database_url)
    assert bad.returncode == 2 and "no words to search for" in bad.stderr

    consistent = cli("verify-index", url=database_url)
    assert consistent.returncode == 0, consistent.stdout
    assert "acme: 5 archived, 5 indexed, 0 missing, 0 extra" in consistent.stdout
