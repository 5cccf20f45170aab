"""The archive lifecycle: erasure, legal holds, retention and their audit.

Design (issue 14). The archive is the truth and the index follows it
through the queue: an erasure is ONE transaction that deletes the archive
rows (locations go with them), drops index jobs nobody has started,
enqueues a delete job per message through the queue's enqueue path, records
each message in ``mail_erasures`` and writes the audit row. The worker's
delete handler then removes the document; the delete job's completion is
the proof. Per-message ordering (guarantee 3) puts each delete behind any
index job already claimed, so the delete wins a race with a re-index.

Legal holds are checked inside that transaction (tenant and mailbox holds,
and what a query hold recorded when it was added) and, just before it,
through the index (what a query hold finds now). Adding a hold takes the
tenant's lifecycle lock exclusively, erasures take it shared: no erasure
commits under a hold added while it ran. Erasure of held mail is refused
whole, naming the held ids and their holds (the safe default: nothing of a
mixed set goes); retention skips held mail instead.

Modules: ``audit`` (the audit log), ``holds``, ``matching`` (ids a
search-language query finds), ``erasure``, ``retention``.
"""
