"""Bytes in, documents out: the archive (each message once per tenant),
MIME parsing into index documents, and the indexing job handlers."""
