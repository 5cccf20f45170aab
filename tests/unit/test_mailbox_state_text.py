"""`mailbox list`'s state column."""

from __future__ import annotations

from datetime import UTC, datetime

from nexarch_events.cli.mailbox import _state_text

ROW = {"enabled": True, "last_error": None, "warning": None, "last_success_at": None,
       "last_synced_uid": 0, "failures": 0, "idle_status": None}


def test_a_first_sync_cut_short_says_how_far_it_got() -> None:
    """After an interrupted first sync the list said "not synced yet" while
    its messages were archived and searchable (an operator audit)."""
    assert _state_text(ROW) == "not synced yet"
    assert _state_text({**ROW, "last_synced_uid": 40}) == \
        "first sync not finished (imported up to UID 40)"
    assert _state_text({**ROW, "last_synced_uid": 40,
                        "last_success_at": datetime.now(UTC)}) == "ok"
    assert _state_text({**ROW, "last_synced_uid": 40, "failures": 2}).endswith(
        "; 2 message(s) failing (mailbox failures)")
