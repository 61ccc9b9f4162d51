"""Scale-out measurements: PgBouncer, Galera, PostgreSQL failover, many worker hosts (docs/scaling.md)."""
