"""Connection factories from DSNs: postgresql://... for psycopg, mysql://... for PyMySQL,
mysql+mysqlclient://... for mysqlclient."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, unquote_plus, urlencode, urlsplit

from proletarian_ref.errors import ConfigurationError

_PG_SCHEMES = ("postgresql", "postgres")
# mysqlclient's module is MySQLdb, the name SQLAlchemy's URLs give it.
_MYSQLCLIENT_SCHEMES = ("mysql+mysqlclient", "mysql+mysqldb")
_MYSQL_SCHEMES = ("mysql", "mysql+pymysql", "mariadb", *_MYSQLCLIENT_SCHEMES)
PREPARE_THRESHOLD: Final = "prepare_threshold"
# Query options whose value is a secret: libpq takes `?password=` and `?sslpassword=` (the client key's
# passphrase) as well as the password in user:password@.
_SECRET_OPTIONS: Final = frozenset({"password", "sslpassword"})
_HIDDEN: Final = "***"


def dialect_of_dsn(dsn: str) -> str:
    scheme = urlsplit(dsn).scheme.lower()
    if scheme in _PG_SCHEMES:
        return "postgresql"
    if scheme in _MYSQL_SCHEMES:
        return "mysql"
    raise ConfigurationError(
        f"cannot tell the database of DSN {redact(dsn)!r}: it must start with postgresql:// or mysql://"
    )


def _is_secret(key: str) -> bool:
    return unquote_plus(key).lower() in _SECRET_OPTIONS


def _secret_values(query: str) -> list[str]:
    """The raw values of the options of a DSN query that carry a secret."""
    pieces = [piece.partition("=") for piece in query.split("&")] if query else []
    return [value for key, _, value in pieces if value and _is_secret(key)]


def redact(dsn: str) -> str:
    """The DSN with every secret hidden (user:***@, ?password=***), for every message and log that shows one.

    The rest stays as written (postgresql:///db keeps its empty host). An empty password is left as it
    is: there is nothing to hide, and *** would suggest there was.
    """
    parts = urlsplit(dsn)
    head, mark, rest = dsn.partition("?")
    if parts.password:
        userinfo, _, hosts = parts.netloc.rpartition("@")
        hidden = f"{userinfo.split(':', 1)[0]}:{_HIDDEN}@{hosts}"
        head = head.replace(f"//{parts.netloc}", f"//{hidden}", 1)
    query, hash_mark, fragment = rest.partition("#")
    pieces = [piece.partition("=") for piece in query.split("&")]
    query = "&".join(
        f"{key}={_HIDDEN}" if value and _is_secret(key) else key + sep + value for key, sep, value in pieces
    )
    return head + mark + query + hash_mark + fragment


def scrub(text: str, dsn: str) -> str:
    """`text` (a driver's error, say) with every secret of `dsn` hidden, as written in it and decoded."""
    parts = urlsplit(dsn)
    given = [parts.password or "", *_secret_values(parts.query)]
    secrets = {form for secret in given for form in (secret, unquote(secret), unquote_plus(secret)) if form}
    # Longest first, so that a secret holding a shorter one is hidden whole.
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, _HIDDEN)
    return text


def mysql_connect_kwargs(dsn: str) -> dict[str, Any]:
    """PyMySQL keyword arguments for mysql://user:password@host:port/database?option=value.

    Options: `unix_socket`, `connect_timeout`, `read_timeout`, `write_timeout`, `charset` (default
    utf8mb4), and TLS as MySQL's client names it (`ssl_mode`, `ssl_ca`, `ssl_cert`, `ssl_key`) or as
    PyMySQL does (`ssl_verify_cert`, `ssl_verify_identity`, `ssl_disabled`); docs/mysql.md has the table.
    """
    kwargs, tls = _mysql_options(dsn)
    try:
        kwargs.update(_pymysql_tls(*_tls_mode(tls)))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} in {redact(dsn)!r}") from None
    return kwargs


def mysqlclient_connect_kwargs(dsn: str) -> dict[str, Any]:
    """mysqlclient's (MySQLdb.connect's) keyword arguments for the same DSN, with the same options and
    the same meaning: the TLS mode as `ssl_mode`, the CA and client certificate in `ssl`. Bytes (an id)
    go as _binary'...', as PyMySQL sends them: without the introducer mysqlclient writes them as a string
    in the connection's character set, which MySQL (not MariaDB) answers with warning 1300, "Invalid
    utf8mb4 character string" (MySQL bug 79317)."""
    kwargs, tls = _mysql_options(dsn)
    kwargs["binary_prefix"] = True
    try:
        kwargs.update(_mysqlclient_tls(*_tls_mode(tls)))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} in {redact(dsn)!r}") from None
    return kwargs


def _mysql_options(dsn: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The keyword arguments both drivers name alike, and the TLS options still to be translated."""
    parts = urlsplit(dsn)
    kwargs: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else "root",
        "password": unquote(parts.password) if parts.password else "",
        "charset": "utf8mb4",
    }
    database = parts.path.lstrip("/")
    if database:
        kwargs["database"] = unquote(database)
    tls: dict[str, str] = {}
    for key, value in parse_qsl(parts.query):
        if key in ("unix_socket", "charset"):
            kwargs[key] = value
        elif key in ("connect_timeout", "read_timeout", "write_timeout"):
            kwargs[key] = int(value)
        elif key in _TLS_OPTIONS:
            tls[key] = value
        else:
            hint = " (TLS options are ssl_mode, ssl_ca, ssl_cert and ssl_key)" if "ssl" in key else ""
            raise ConfigurationError(f"unsupported MySQL DSN option {key!r}{hint} in {redact(dsn)!r}")
    return kwargs, tls


_TLS_OPTIONS: Final = frozenset(
    {"ssl_mode", "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_cert", "ssl_verify_identity", "ssl_disabled"}
)
_SSL_MODES: Final = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
# PyMySQL's boolean names, as the ssl_mode each one asks for when true, the strictest last.
_PYMYSQL_FLAGS: Final = {
    "ssl_disabled": "disabled",
    "ssl_verify_cert": "verify_ca",
    "ssl_verify_identity": "verify_identity",
}


def _flag(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{key} must be true or false, got {value!r}")


def _tls_mode(options: dict[str, str]) -> tuple[str | None, str | None, str | None, str | None]:
    """The TLS mode the DSN's TLS options ask for (None: none asked for), its CA, certificate and key.

    The modes are MySQL's client's (--ssl-mode). With a CA and no mode the server's certificate is
    verified (verify_ca), as the mysql client does; PyMySQL alone would encrypt without verifying.
    """
    mode = options.get("ssl_mode")
    if mode is not None:
        mode = mode.lower()
        if mode not in _SSL_MODES:
            raise ConfigurationError(
                f"ssl_mode must be one of {', '.join(_SSL_MODES)}, got {options['ssl_mode']!r}"
            )
    # In the order of _PYMYSQL_FLAGS, so the last is the strictest (verify_identity implies verify_ca).
    flagged = [(flag, asked) for flag, asked in _PYMYSQL_FLAGS.items() if _flag(flag, options.get(flag, "0"))]
    if len(flagged) > 1 and flagged[0][1] == "disabled":
        raise ConfigurationError(f"ssl_disabled=true contradicts {flagged[1][0]}=true")
    if flagged:
        flag, asked = flagged[-1]
        if mode is not None and mode != asked:
            raise ConfigurationError(f"{flag}=true contradicts ssl_mode={mode}")
        mode = asked
    ca, cert, key = options.get("ssl_ca"), options.get("ssl_cert"), options.get("ssl_key")
    if key is not None and cert is None:
        raise ConfigurationError("ssl_key needs ssl_cert (the client certificate it belongs to)")
    if mode is None:
        if ca is not None:
            mode = "verify_ca"
        elif cert is not None:
            mode = "required"
    if mode == "disabled" and (ca or cert):
        raise ConfigurationError("ssl_mode=disabled contradicts ssl_ca/ssl_cert")
    if mode == "preferred" and (ca or cert):
        raise ConfigurationError("ssl_mode=preferred cannot take ssl_ca/ssl_cert; use required or verify_ca")
    return mode, ca, cert, key


def _pymysql_tls(mode: str | None, ca: str | None, cert: str | None, key: str | None) -> dict[str, Any]:
    """PyMySQL's TLS arguments: an `ssl` context, `ssl_disabled`, or nothing, so that PyMySQL's own
    default holds when no mode was asked for (and for preferred, which is that default)."""
    if mode is None or mode == "preferred":
        return {}
    if mode == "disabled":
        return {"ssl_disabled": True}
    return {"ssl": _tls_context(mode, ca, cert, key)}


def _mysqlclient_tls(mode: str | None, ca: str | None, cert: str | None, key: str | None) -> dict[str, Any]:
    """mysqlclient's TLS arguments: `ssl_mode` and the files in `ssl`. A CA with required verifies, as
    the mysql client does (and _tls_context), so it goes as verify_ca."""
    if mode is None:
        return {}
    if mode == "required" and ca is not None:
        mode = "verify_ca"
    files = {name: path for name, path in (("ca", ca), ("cert", cert), ("key", key)) if path is not None}
    for name, path in files.items():
        if not Path(path).is_file():
            raise ConfigurationError(f"cannot load ssl_{name}: no such file {path!r}")
    return {"ssl_mode": mode.upper(), **({"ssl": files} if files else {})}


def _tls_context(mode: str, ca: str | None, cert: str | None, key: str | None) -> Any:
    import ssl

    # A CA with required is verified anyway, as the mysql client does with --ssl-mode=REQUIRED --ssl-ca.
    verify = mode in ("verify_ca", "verify_identity") or ca is not None
    try:
        context = ssl.create_default_context(cafile=ca)
        context.check_hostname = mode == "verify_identity"
        context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
        if cert is not None:
            context.load_cert_chain(cert, keyfile=key)
    except (OSError, ssl.SSLError) as exc:
        which = "ssl_ca" if ca is not None and not Path(ca).is_file() else "ssl_cert/ssl_key"
        raise ConfigurationError(f"cannot load {which}: {exc}") from None
    return context


def postgresql_connect_args(dsn: str) -> tuple[str, dict[str, Any]]:
    """The conninfo for libpq and psycopg's own keyword arguments, from a postgresql:// DSN.

    `prepare_threshold` is psycopg's, not libpq's (which refuses options it does not know), so it is
    taken out of the query: `?prepare_threshold=none` turns off psycopg's automatic prepared statements,
    which PgBouncer before 1.21 cannot carry in transaction mode (docs/scaling.md).
    """
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kwargs: dict[str, Any] = {}
    kept = []
    for key, value in query:
        if key != PREPARE_THRESHOLD:
            kept.append((key, value))
        elif value.lower() == "none":
            kwargs[PREPARE_THRESHOLD] = None
        elif value.isdigit():
            kwargs[PREPARE_THRESHOLD] = int(value)
        else:
            raise ConfigurationError(
                f"{PREPARE_THRESHOLD} must be none or a whole number >= 0, got {value!r} in {redact(dsn)!r}"
            )
    if len(kept) == len(query):
        return dsn, kwargs
    return parts._replace(query=urlencode(kept)).geturl(), kwargs


# libpq's options that asyncpg does not know: it would send each to the server as a setting, which the
# server refuses (connect_timeout is asyncpg_connect_args's `timeout`).
_LIBPQ_ONLY: Final = frozenset(
    {
        "channel_binding",
        "fallback_application_name",
        "gssdelegation",
        "gssencmode",
        "hostaddr",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "load_balance_hosts",
        "replication",
        "require_auth",
        "requirepeer",
        "sslcertmode",
        "sslcompression",
        "sslcrldir",
        "sslsni",
        "tcp_user_timeout",
    }
)


def asyncpg_connect_args(dsn: str) -> tuple[str, dict[str, Any]]:
    """The URL and keyword arguments for asyncpg.connect / asyncpg.create_pool, from a postgresql:// DSN.

    asyncpg reads the URL itself (user:password@, host, port, database, sslmode, sslrootcert, sslcert,
    sslkey, sslpassword, passfile, target_session_attrs) and sends any other query option to the server as
    a setting (application_name, options). So the options only libpq or psycopg know are taken out:
    `connect_timeout` becomes asyncpg's `timeout`, `prepare_threshold=none` its `statement_cache_size=0`
    (no named prepared statements, for PgBouncer in transaction mode), and the rest are refused.
    """
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kwargs: dict[str, Any] = {}
    kept = []
    for key, value in query:
        if key == PREPARE_THRESHOLD:
            if value.lower() == "none":
                kwargs["statement_cache_size"] = 0
            elif not value.isdigit():
                raise ConfigurationError(
                    f"{PREPARE_THRESHOLD} must be none or a whole number >= 0, got {value!r} in "
                    f"{redact(dsn)!r}"
                )
        elif key == "connect_timeout":
            if not value.isdigit():
                raise ConfigurationError(
                    f"connect_timeout must be a whole number of seconds, got {value!r} in {redact(dsn)!r}"
                )
            if int(value) > 0:  # libpq's 0 is no bound; asyncpg's own default then holds
                kwargs["timeout"] = float(value)
        elif key in _LIBPQ_ONLY:
            raise ConfigurationError(
                f"asyncpg does not take libpq's option {key!r} (it would send it to the server as a setting) "
                f"in {redact(dsn)!r}"
            )
        else:
            kept.append((key, value))
    if len(kept) == len(query):
        return dsn, kwargs
    return parts._replace(query=urlencode(kept)).geturl(), kwargs


def connection_factory(dsn: str, **overrides: Any) -> Callable[[], Any]:
    """A zero-argument callable opening a new connection to `dsn` (a data source for a queue worker)."""
    dialect = dialect_of_dsn(dsn)
    if dialect == "postgresql":
        import psycopg

        conninfo, options = postgresql_connect_args(dsn)
        options.update(overrides)

        def connect_postgresql() -> Any:
            return psycopg.connect(conninfo, **options)

        return connect_postgresql

    if urlsplit(dsn).scheme.lower() in _MYSQLCLIENT_SCHEMES:
        import MySQLdb

        mysqlclient_kwargs = {**mysqlclient_connect_kwargs(dsn), **overrides}

        def connect_mysqlclient() -> Any:
            return MySQLdb.connect(**mysqlclient_kwargs)

        return connect_mysqlclient

    import pymysql

    kwargs = {**mysql_connect_kwargs(dsn), **overrides}

    def connect_mysql() -> Any:
        return pymysql.connect(**kwargs)

    return connect_mysql


def failover_connection_factory(dsns: Sequence[str], **overrides: Any) -> Callable[[], Any]:
    """A connection factory that tries `dsns` in order on every call and returns the first that connects.

    For a cluster whose nodes all take writes but that you run with one writer (MariaDB Galera, see
    docs/scaling.md): give every worker and enqueuer the same order, and all of them write to the first
    node that is up, moving together to the next when it goes down. On PostgreSQL prefer libpq's own
    multi-host DSN with target_session_attrs=read-write. If no node connects, the last node's error is
    raised.
    """
    if not dsns:
        raise ConfigurationError("failover_connection_factory needs at least one DSN")
    factories = [connection_factory(dsn, **overrides) for dsn in dsns]

    def connect_first_reachable() -> Any:
        for factory in factories[:-1]:
            try:
                return factory()
            except Exception:  # This node is down: the next one is the point of the list.
                continue
        return factories[-1]()

    return connect_first_reachable
