"""The endpoints. Each handler authenticates, settles the tenant scope, and
asks the queue, the registry, the index or the event stream; the shapes
are in openapi.yaml."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from importlib import resources
from typing import TYPE_CHECKING

import trio

from ..db import sqlfiles
from ..errors import DatabaseError, InvalidJobError, JobNotFound
from ..importer.accounts import FOLDER_STATES, AccountRegistry
from ..importer.mailboxes import MailboxRegistry
from ..importer.state import StateStore
from ..index.base import (
    MAX_LIMIT,
    MAX_OFFSET,
    MAX_QUERY_LENGTH,
    SORT_ORDERS,
    InvalidQuery,
    SearchQuery,
    parse_query,
)
from ..lifecycle import audit
from ..lifecycle.erasure import Eraser, HeldByLegalHold, MessageNotFound
from ..lifecycle.holds import MAX_MAILBOX, MAX_REASON, Hold, HoldNotFound, Holds, UnevaluableHold
from ..lifecycle.matching import TooManyMatches
from ..lifecycle.retention import MAX_DAYS, RetentionPolicy, policies, set_policy
from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..models import Job, JobStatus
from ..queue.jobs import Queue
from .asgi import ApiError, Request, Response, Router, Stream, json_response
from .auth import Principal, authenticate, require_admin, tenant_scope
from .events import EventStream, StreamSlots, Watermark
from .store import mailboxes_of

if TYPE_CHECKING:
    from . import ApiContext

_SQL = sqlfiles.queries("queue.sql")
_IMPORTER_SQL = sqlfiles.queries("importer.sql")
_LIFECYCLE_SQL = sqlfiles.queries("lifecycle.sql")

READY_TIMEOUT_S = 2.0
#: Seconds a client refused a stream (429) is asked to wait.
STREAM_RETRY_AFTER_S = 5
SEARCH_PARAMS = ("tenant", "q", "limit", "offset", "sender", "mailbox", "since", "until",
                 "received_since", "received_until", "sort")
THROUGHPUT_WINDOW_S = 60.0

#: The status page may load its own script and style and call this API;
#: nothing else (no inline script, no third party, no framing).
_PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
             "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}

Handler = Callable[[Request], Awaitable[Response | Stream]]
AuthedHandler = Callable[[Request, Principal], Awaitable[Response | Stream]]


def build_router(ctx: ApiContext) -> Router:
    api = _Api(ctx)
    router = Router()
    router.add("GET", "/healthz", api.healthz)
    router.add("GET", "/readyz", api.readyz)
    router.add("GET", "/openapi.yaml", api.spec)
    for path in _STATIC:
        router.add("GET", path, api.static)
    # The query parameters of each route, as in openapi.yaml.
    tenant = ("tenant",)
    authed: list[tuple[str, str, AuthedHandler, tuple[str, ...]]] = [
        ("GET", "/metrics", api.metrics, ()),
        ("GET", "/queue", api.queue_stats, tenant),
        ("GET", "/jobs/{id}", api.job, tenant),
        ("POST", "/jobs/{id}/retry", api.retry_job, tenant),
        ("GET", "/mailboxes", api.mailboxes, tenant),
        ("POST", "/mailboxes/{id}/sync", api.sync_mailbox, tenant),
        ("GET", "/accounts", api.accounts, tenant),
        ("POST", "/accounts/{id}/sync", api.sync_account, tenant),
        ("GET", "/search", api.search, SEARCH_PARAMS),
        ("GET", "/events", api.events, tenant),
        ("DELETE", "/messages/{id}", api.erase_message, tenant),
        ("GET", "/audit", api.audit_log, ("tenant", "limit", "before", "action")),
        ("GET", "/holds", api.holds, ("tenant", "removed")),
        ("DELETE", "/holds/{id}", api.remove_hold, tenant),
        ("GET", "/retention", api.retention, tenant),
    ]
    for method, path, handler, params in authed:
        router.add(method, path, api.authed(handler), params)
    # The routes that take a JSON body, and its fields (openapi.yaml).
    with_body: list[tuple[str, str, AuthedHandler, tuple[str, ...]]] = [
        ("POST", "/holds", api.add_hold, ("tenant", "scope", "mailbox", "query", "reason")),
        ("PUT", "/retention", api.set_retention, ("tenant", "days")),
    ]
    for method, path, handler, fields in with_body:
        router.add(method, path, api.authed(handler), (), body=fields)
    return router


class _Api:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.queue = Queue(ctx.db, ctx.settings.queue)
        self.registry = MailboxRegistry(ctx.db)
        self.accounts_registry = AccountRegistry(ctx.db)
        self.states = StateStore(ctx.db)
        package = resources.files("nexarch_events")
        self.files = {path: (package.joinpath("static", name).read_bytes(), kind)
                      for path, (name, kind) in _STATIC.items()}
        self.spec_text = resources.files("nexarch_events.api").joinpath(
            "openapi.yaml").read_bytes()
        self.slots = StreamSlots(ctx.settings.api.max_streams,
                                 ctx.settings.api.max_streams_per_token)

    def authed(self, handler: AuthedHandler) -> Handler:
        async def check(request: Request) -> Response | Stream:
            principal = authenticate(request, self.ctx.settings.api.tokens)
            return await handler(request, principal)
        return check

    # -- open to all -----------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        database = False
        # Its own connection (probe_db): when the shared pool is exhausted
        # the service is busy, not dead.
        probe = self.ctx.probe_db or self.ctx.db
        with trio.move_on_after(READY_TIMEOUT_S):
            try:
                database = await probe.fetchval(_SQL["ping"]) == 1
            except DatabaseError:
                database = False
        listener = self.ctx.listener.connected
        body = {"database": database, "listener": listener}
        return json_response(body, 200 if database and listener else 503)

    async def static(self, request: Request) -> Response:
        body, kind = self.files[request.path]
        headers = [("cache-control", "no-cache")]
        if request.path == "/":
            headers.append(("content-security-policy", _PAGE_CSP))
        return Response(200, body, kind, tuple(headers))

    async def spec(self, request: Request) -> Response:
        return Response(200, self.spec_text, "application/yaml; charset=utf-8",
                        (("cache-control", "no-cache"),))

    # -- token needed ----------------------------------------------------------

    async def metrics(self, request: Request, who: Principal) -> Response:
        require_admin(who, request)
        stats = await self.queue.stats()
        lag_rows = await self.ctx.db.fetch(_IMPORTER_SQL["lag"])
        text = self.ctx.metrics.render(stats, lag_rows)
        return Response(200, text.encode("utf-8"), METRICS_CONTENT_TYPE)

    async def queue_stats(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        stats = await self.queue.stats_for(tenant)
        recent = await self.queue.succeeded_within(THROUGHPUT_WINDOW_S, tenant_slug=tenant)
        latency = self.ctx.metrics.wake_latency

        def ms(q: float) -> float | None:
            value = latency.percentile(q)
            return None if value is None else round(value * 1000.0, 3)

        return json_response({
            "tenant": tenant,
            "counts": {status.value: n for status, n in stats.counts.items()},
            "oldest_ready_age_s": stats.oldest_ready_age_s,
            "wake_latency_ms": {"p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99)},
            "succeeded_last_minute": recent,
        })

    async def job(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        job_id = request.path_id("id", "job")
        return json_response(_job_json(await self._job(job_id, tenant)))

    async def retry_job(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        job_id = request.path_id("id", "job")
        job = await self._job(job_id, tenant)
        if job.status != JobStatus.FAILED:
            raise ApiError(409, f"job {job_id} is {job.status.value}; only failed jobs can be "
                                "retried")
        result = await self.queue.requeue_failed(job_id=job_id, tenant_slug=job.tenant_slug)
        if result.superseded:
            raise ApiError(409, f"job {job_id} was overtaken by a newer job for the same "
                                "message; running it again would undo that job")
        if not result.requeued:
            raise ApiError(409, f"job {job_id} is no longer failed (retried meanwhile?)")
        return json_response({"requeued": list(result.requeued),
                              "superseded": list(result.superseded)})

    async def _job(self, job_id: int, tenant: str | None) -> Job:
        try:
            return await self.queue.status(job_id, tenant_slug=tenant)
        except JobNotFound:
            scope = "" if tenant is None else f" in tenant {tenant!r}"
            raise ApiError(404, f"no job {job_id}{scope}") from None

    async def mailboxes(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        rows = await self.registry.list(tenant)
        return json_response({"tenant": tenant, "mailboxes": [_mailbox_json(r) for r in rows]})

    async def sync_mailbox(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        mailbox_id = request.path_id("id", "mailbox")
        try:
            config = await self.registry.get_by_id(mailbox_id, tenant_slug=tenant)
            if not config.enabled:
                # Nobody would run it: a 202 that is never answered (an
                # operator audit).
                raise ApiError(409, f"mailbox {mailbox_id} ({config.tenant_slug}/{config.name}) "
                                    "is paused: enable it to sync it")
            await self.states.request_sync(config.tenant_slug, config.name)
        except JobNotFound:
            scope = "" if tenant is None else f" in tenant {tenant!r}"
            raise ApiError(404, f"no mailbox {mailbox_id}{scope}") from None
        return json_response({"sync_requested": True, "id": mailbox_id,
                              "tenant": config.tenant_slug, "name": config.name}, 202)

    async def accounts(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        rows = await self.accounts_registry.overview(tenant)
        return json_response({"tenant": tenant, "accounts": [_account_json(r) for r in rows]})

    async def sync_account(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        account_id = request.path_id("id", "account")
        try:
            owner, name, mailboxes = await self.accounts_registry.request_sync(
                account_id, tenant_slug=tenant)
        except JobNotFound:
            scope = "" if tenant is None else f" in tenant {tenant!r}"
            raise ApiError(404, f"no account {account_id}{scope}") from None
        return json_response({"sync_requested": True, "id": account_id, "tenant": owner,
                              "name": name, "mailboxes": mailboxes}, 202)

    async def search(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=True)
        assert tenant is not None
        limit = request.int_param("limit", 20, low=1, high=MAX_LIMIT)
        offset = request.int_param("offset", 0, low=0, high=MAX_OFFSET)
        text = request.param("q") or ""
        since, until = _timestamp(request, "since"), _timestamp(request, "until")
        received_since = _timestamp(request, "received_since")
        received_until = _timestamp(request, "received_until")
        sort = request.param("sort") or "relevance"
        if sort not in SORT_ORDERS:
            raise ApiError(400, f"query parameter 'sort' must be one of "
                                f"{', '.join(SORT_ORDERS)}, got {sort[:40]!r}")
        if since is not None and until is not None and since >= until:
            return json_response(_no_hits("since is not before until: no mail can be "
                                          "sent in between"))
        if received_since is not None and received_until is not None \
                and received_since >= received_until:
            return json_response(_no_hits("received_since is not before received_until: no "
                                          "mail can be received in between"))
        try:
            query = SearchQuery(tenant, "",
                                sender=request.param("sender") or None,
                                mailbox=request.param("mailbox") or None,
                                date_from=since, date_to=until, limit=limit, offset=offset,
                                received_from=received_since, received_to=received_until,
                                sort=sort)
        except (InvalidQuery, InvalidJobError) as exc:
            raise ApiError(400, f"bad search: {exc}") from None
        try:
            query = replace(query, text=text)
        except InvalidQuery as exc:
            if len(text) > MAX_QUERY_LENGTH or "\x00" in text:
                raise ApiError(400, f"bad search: {exc}") from None
            # Words the index cannot search for (punctuation only, or only
            # exclusions): nothing matches, and the reason comes along.
            return json_response(_no_hits(str(exc), parse_query(text).ignored))
        result = await self.ctx.backend.search(query)
        seen = await mailboxes_of(self.ctx.db, tenant, [hit.archive_id for hit in result.hits])
        return json_response({
            "total": result.total, "exact_total": result.exact_total,
            "ignored": list(result.ignored), "hits": [
                {"archive_id": hit.archive_id, "subject": hit.subject, "sender": hit.sender,
                 "sent_at": hit.sent_at, "received_at": hit.received_at,
                 "snippet": hit.snippet, "mailboxes": seen.get(hit.archive_id, [])}
                for hit in result.hits]})

    async def erase_message(self, request: Request, who: Principal) -> Response:
        """Erase one message (audited as the token's name). A tenant token
        erases its own mail only; another tenant's message is "not found",
        exactly like one that does not exist."""
        tenant = tenant_scope(who, request, required=False)
        archive_id = request.path_id("id", "message")
        scope = "" if tenant is None else f" in tenant {tenant!r}"
        if tenant is None:  # admin: the message's own tenant
            tenant = await self.ctx.db.fetchval(_LIFECYCLE_SQL["message_tenant"], archive_id)
            if tenant is None:
                raise ApiError(404, f"no archived message {archive_id}")
        eraser = Eraser(self.ctx.db, self.ctx.backend)
        try:
            result = await eraser.erase(tenant, [archive_id], actor=who.name)
        except MessageNotFound:
            raise ApiError(404, f"no archived message {archive_id}{scope}") from None
        except (HeldByLegalHold, UnevaluableHold) as exc:
            raise ApiError(409, str(exc)) from None
        if not result.erased:
            raise ApiError(404, f"no archived message {archive_id}{scope} (erased before)")
        return json_response({"tenant": tenant, "archive_id": archive_id,
                              "delete_job": result.delete_jobs[0],
                              "audit_id": result.audit_id}, 202)

    async def audit_log(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        limit = request.int_param("limit", 100, low=1, high=audit.MAX_LIST)
        before = request.int_param("before", 0, low=1, high=2**63 - 1) \
            if request.param("before") is not None else None
        raw = request.param("action")
        try:
            action = None if raw is None else audit.AuditAction(raw)
        except ValueError:
            raise ApiError(400, "query parameter 'action' must be one of "
                                + ", ".join(a.value for a in audit.AuditAction)) from None
        entries = await audit.entries(self.ctx.db, tenant_slug=tenant, limit=limit,
                                      before=before, action=action)
        return json_response({"tenant": tenant, "entries": [
            {"id": e.id, "at": e.at, "actor": e.actor, "action": e.action.value,
             "tenant": e.tenant_slug, "target": e.target, "count": e.count}
            for e in entries]})

    async def holds(self, request: Request, who: Principal) -> Response:
        tenant = tenant_scope(who, request, required=False)
        raw = request.param("removed")
        if raw not in (None, "true", "false"):
            raise ApiError(400, "query parameter 'removed' must be true or false")
        rows = await Holds(self.ctx.db, self.ctx.backend).list(
            tenant, include_removed=raw == "true")
        return json_response({"tenant": tenant, "holds": [_hold_json(h) for h in rows]})

    # Holds and retention are changed by admin tokens only: a hold is a
    # legal instrument of the operator, not of a tenant's own client (and a
    # tenant able to remove its holds or shorten its retention could
    # destroy what the hold protects). Tenant tokens get 403 before the
    # body is read; they read their own holds (GET /holds) and the audit.

    async def add_hold(self, request: Request, who: Principal) -> Response:
        require_admin(who, request)
        body = await request.json_body()
        tenant = body.text("tenant", max_length=63)
        scope = body.text("scope", max_length=20)
        assert tenant is not None and scope is not None
        try:
            hold = await Holds(self.ctx.db, self.ctx.backend).add(
                tenant, scope, reason=body.text("reason", max_length=MAX_REASON) or "",
                actor=who.name, mailbox=body.text("mailbox", required=False,
                                                  max_length=MAX_MAILBOX),
                query=body.text("query", required=False, max_length=MAX_QUERY_LENGTH))
        except (InvalidJobError, InvalidQuery, TooManyMatches) as exc:
            raise ApiError(400, f"bad hold: {exc}") from None
        return json_response(_hold_json(hold), 201)

    async def remove_hold(self, request: Request, who: Principal) -> Response:
        require_admin(who, request)
        tenant = tenant_scope(who, request, required=False)
        hold_id = request.path_id("id", "hold")
        try:
            hold = await Holds(self.ctx.db, self.ctx.backend).remove(
                hold_id, actor=who.name, tenant_slug=tenant)
        except HoldNotFound as exc:
            raise ApiError(404, str(exc)) from None
        return json_response(_hold_json(hold))

    async def retention(self, request: Request, who: Principal) -> Response:
        require_admin(who, request)
        tenant = tenant_scope(who, request, required=False)
        found = [p for p in await policies(self.ctx.db, self.ctx.settings.retention)
                 if tenant is None or p.tenant_slug == tenant]
        return json_response({"tenant": tenant,
                              "interval_s": self.ctx.settings.retention.interval,
                              "policies": [_policy_json(p) for p in found]})

    async def set_retention(self, request: Request, who: Principal) -> Response:
        require_admin(who, request)
        body = await request.json_body()
        tenant = body.text("tenant", max_length=63)
        days = body.whole_number("days", low=1, high=MAX_DAYS, nullable=True)
        assert tenant is not None
        try:
            await set_policy(self.ctx.db, tenant, days, actor=who.name)
        except InvalidJobError as exc:
            raise ApiError(400, f"bad retention: {exc}") from None
        policy = next((p for p in await policies(self.ctx.db, self.ctx.settings.retention)
                       if p.tenant_slug == tenant), None)
        return json_response({"tenant": tenant,
                              "policy": None if policy is None else _policy_json(policy)})

    async def events(self, request: Request, who: Principal) -> Stream:
        tenant = tenant_scope(who, request, required=False)
        resume = None
        raw = request.header("last-event-id")
        if raw is not None:
            try:
                resume = Watermark.parse(raw)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
        refused = self.slots.take(who.name)
        if refused is not None:
            raise ApiError(429, f"too many event streams: {refused}; retry later",
                           [("retry-after", str(STREAM_RETRY_AFTER_S))])
        # Set-up and replays read from the streams' own pool: a burst of
        # streams waits there, never for the workers' connections.
        stream = EventStream(self.ctx.streams_db or self.ctx.db, self.ctx.listener,
                             tenant=tenant, resume=resume, keepalive=self.ctx.sse_keepalive_s)
        # no-transform/X-Accel-Buffering: proxies must pass events on at once.
        return Stream(stream.run, "text/event-stream; charset=utf-8",
                      (("x-accel-buffering", "no"), ("cache-control", "no-store, no-transform")),
                      on_close=partial(self.slots.give_back, who.name))


#: What /mailboxes shows of a mailbox: never the user name or password
#: reference, nor the CA file's path.
_MAILBOX_FIELDS = ("id", "name", "host", "port", "folder", "tls_mode", "use_idle", "enabled",
                   "last_uidvalidity", "last_synced_uid", "server_uidnext", "interval_seconds",
                   "imported_total", "last_run_started_at", "last_run_finished_at",
                   "last_success_at", "last_error", "last_error_at", "warning",
                   "sync_requested_at", "failures", "idle_status", "last_attempt_at",
                   "auth_method", "account", "folder_gone_at")


def _no_hits(warning: str, ignored: Sequence[str] = ()) -> dict[str, object]:
    """A search that cannot match anything, and why."""
    return {"total": 0, "exact_total": True, "ignored": list(ignored), "hits": [],
            "warning": warning}


def _timestamp(request: Request, name: str) -> datetime | None:
    """An RFC 3339 date or date-time (also without seconds or offset, as the
    CLI takes it; UTC when it has no offset), in UTC; 400 if not."""
    raw = request.param(name)
    if raw is None:
        return None
    # ASCII only: fromisoformat alone would take other scripts' digits.
    if not _ISO_DATE.fullmatch(raw):
        raise ApiError(400, f"query parameter {name!r} must be a date or date-time "
                            f"(YYYY-MM-DD[THH:MM[:SS]][Z|+HH:MM]), got {raw[:40]!r}")
    try:
        parsed = datetime.fromisoformat(raw.upper())
    except ValueError as exc:
        raise ApiError(400, f"query parameter {name!r}: {exc}") from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the first UTC instant
        return (datetime.min if parsed.year == 1 else datetime.max).replace(tzinfo=UTC)


_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
                       r"([Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?"
                       r"([Zz]|[+-][0-9]{2}:[0-9]{2})?)?")


def _mailbox_json(row: dict[str, object]) -> dict[str, object]:
    out = {name: row.get(name) for name in _MAILBOX_FIELDS}
    out["tenant"] = row.get("tenant_slug")
    uidnext, synced = row.get("server_uidnext"), row.get("last_synced_uid")
    # UIDs the server announced (UIDNEXT at the last run) above the watermark.
    out["pending_messages"] = max(0, uidnext - 1 - synced) \
        if isinstance(uidnext, int) and isinstance(synced, int) else None
    success = row.get("last_success_at")
    out["since_success_s"] = round((datetime.now(UTC) - success).total_seconds(), 3) \
        if isinstance(success, datetime) else None
    return out


#: What /accounts shows of an account: never the user name, the secret
#: references, the OAuth client or the CA file's path.
_ACCOUNT_FIELDS = ("id", "name", "host", "port", "tls_mode", "auth_method", "use_idle",
                   "interval_seconds", "enabled", "all_mail_only", "exclude_patterns",
                   "include_patterns", "last_discovery_at", "last_discovery_error")
#: ... and of each folder.
_FOLDER_FIELDS = ("id", "name", "folder", "state", "enabled", "folder_gone_at",
                  "last_uidvalidity", "last_synced_uid", "server_uidnext", "server_exists",
                  "imported_total", "failures", "last_run_finished_at", "last_success_at",
                  "last_error", "last_error_at", "warning", "idle_status", "sync_requested_at",
                  "last_attempt_at", "interval_seconds")


def _account_json(row: dict[str, object]) -> dict[str, object]:
    out = {name: row.get(name) for name in _ACCOUNT_FIELDS}
    out["tenant"] = row.get("tenant_slug")
    raw_folders = row.get("folder_mailboxes")
    folders = raw_folders if isinstance(raw_folders, list) else []
    shown = []
    for folder in folders:
        mailbox = _mailbox_json(folder)
        item = {name: folder.get(name) for name in _FOLDER_FIELDS}
        item["pending_messages"] = mailbox["pending_messages"]
        item["since_success_s"] = mailbox["since_success_s"]
        shown.append(item)
    out["folders"] = shown
    # The account's lag is its worst folder's (gone folders are not synced).
    live = [f for f in shown if f["state"] != "gone"]
    pending = [f["pending_messages"] for f in live if isinstance(f["pending_messages"], int)]
    since = [f["since_success_s"] for f in live]
    out["pending_messages"] = sum(pending) if pending else None
    out["since_success_s"] = None if not since or None in since else max(
        s for s in since if isinstance(s, float))
    if row.get("last_discovery_error"):
        out["state"] = "discovery failed"
    elif row.get("last_discovery_at") is None:
        out["state"] = "not discovered yet"
    else:
        states = {str(f["state"]) for f in live}
        out["state"] = next((s for s in FOLDER_STATES if s in states), "ok")
    return out


def _hold_json(h: Hold) -> dict[str, object]:
    return {"id": h.id, "tenant": h.tenant_slug, "scope": h.scope.value, "mailbox": h.mailbox,
            "query": h.query, "reason": h.reason, "created_by": h.created_by,
            "created_at": h.created_at, "removed_by": h.removed_by,
            "removed_at": h.removed_at, "recorded": h.recorded}


def _policy_json(p: RetentionPolicy) -> dict[str, object]:
    return {"tenant": p.tenant_slug, "days": p.days, "source": p.source,
            "set_by": p.set_by, "set_at": p.set_at}


def _job_json(job: Job) -> dict[str, object]:
    return {"id": job.id, "job_type": job.job_type.value, "tenant": job.tenant_slug,
            "message_id": job.message_id, "status": job.status.value,
            "attempts": job.attempts, "max_attempts": job.max_attempts,
            "available_at": job.available_at, "locked_by": job.locked_by,
            "last_error": job.last_error, "created_at": job.created_at,
            "updated_at": job.updated_at, "finished_at": job.finished_at}
