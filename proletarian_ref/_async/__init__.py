"""The asyncio source of the job code: proletarian_ref/_sync is generated from it (tools/generate_sync.py)."""
