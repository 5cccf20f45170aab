"""Postgres plumbing: the named-query loader (``sqlfiles``), schema
migrations (``migrations``) and the embedded server (``embedded``)."""
