"""A SQLAlchemy 2 application: jobs in its Session's or Connection's transaction, a worker on its Engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fix_db import selected_backends
from sqlalchemy import Engine, Integer, MetaData, String, create_engine, event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from conformance.harness import SqlHarness
from proletarian_ref import aio, enqueue, enqueue_many, process_next_job
from proletarian_ref.errors import ConfigurationError, JobTransactionError
from proletarian_ref.job import JobSpec

pytestmark = pytest.mark.sql_only

# mysqlclient: SQLAlchemy's mysql+mysqldb on the same MySQL server, beside PyMySQL (docs/sqlalchemy.md).
_URL_SCHEMES = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql", "mysqlclient": "mysql+mysqldb"}
_ASYNC_URL_SCHEMES = {"postgresql": "postgresql+psycopg", "mysql": "mysql+aiomysql"}
# The --backends name each parametrization runs under: mysqlclient's is MySQL's server.
_SERVER = {"postgresql": "postgresql", "mysql": "mysql", "mysqlclient": "mysql"}
# The driver each URL's engine connects with (SQLAlchemy's dialect.driver).
_DRIVERS = {"postgresql": "psycopg", "mysql": "pymysql", "mysqlclient": "mysqldb"}


class Base(DeclarativeBase):
    metadata = MetaData()


class Order(Base):
    """The application's own row, written in the transaction that enqueues its job."""

    __tablename__ = "sa_order"
    __table_args__ = {"schema": "proletarian"}  # noqa: RUF012 - SQLAlchemy's declarative form

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    item: Mapped[str] = mapped_column(String(40))


def _url(dsn: str, dialect: str, schemes: dict[str, str] = _URL_SCHEMES) -> str:
    return schemes[dialect] + dsn[dsn.index("://") :]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The dialects --backends chose (tox runs one an env), as the `db` fixture's parametrization does.
    for name, schemes in (("app", _URL_SCHEMES), ("async_app", _ASYNC_URL_SCHEMES)):
        if name in metafunc.fixturenames:
            chosen = [d for d in schemes if _SERVER[d] in selected_backends(metafunc.config)]
            metafunc.parametrize(name, chosen, indirect=True)


@pytest.fixture
def app(request: pytest.FixtureRequest) -> Iterator[tuple[SqlHarness, Engine]]:
    dialect = request.param
    db: SqlHarness = request.getfixturevalue("pg_db" if dialect == "postgresql" else "mysql_db")
    dsn: str = request.getfixturevalue("pg_dsn" if dialect == "postgresql" else "mysql_dsn")
    suffix = db.job_table.rsplit("_", 1)[1]
    Order.__table__.name = f"sa_order_{suffix}"  # type: ignore[attr-defined]
    engine = create_engine(_url(dsn, dialect))
    assert engine.dialect.driver == _DRIVERS[dialect]
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        yield db, engine
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def _orders(engine: Engine) -> list[str]:
    with Session(engine) as session:
        return [order.item for order in session.query(Order).order_by(Order.id)]


def _job_types(db: SqlHarness) -> list[str]:
    return sorted(job.job_type for job in db.jobs())


def test_a_job_enqueued_on_a_session_commits_and_rolls_back_with_its_orm_writes(
    app: tuple[SqlHarness, Engine],
) -> None:
    db, engine = app
    with Session(engine) as session:
        session.add(Order(id=1, item="kept"))
        enqueue(session, "app/kept", {"order": 1}, **db.table_options)
        session.commit()
        session.add(Order(id=2, item="dropped"))
        enqueue(session, "app/dropped", {"order": 2}, **db.table_options)
        session.rollback()
    assert _orders(engine) == ["kept"]
    assert _job_types(db) == [":app/kept"]


def test_enqueue_leaves_the_session_as_it_was_no_flush_no_commit(app: tuple[SqlHarness, Engine]) -> None:
    db, engine = app
    flushes: list[object] = []
    with Session(engine) as session:  # autoflush on, as SQLAlchemy's default
        event.listen(session, "before_flush", lambda *args: flushes.append(args))
        transaction = session.begin()
        order = Order(id=3, item="pending")
        session.add(order)
        enqueue(session, "app/one", {"order": 3}, **db.table_options)
        enqueue_many(session, [JobSpec("app/two", 1), ("app/three", 2)], **db.table_options)
        assert flushes == []
        assert order in session.new
        assert session.get_transaction() is transaction and transaction.is_active
        assert db.jobs() == []  # nothing committed by enqueue
        session.commit()
    assert _orders(engine) == ["pending"]
    assert _job_types(db) == [":app/one", ":app/three", ":app/two"]


def test_a_session_with_no_transaction_begins_one_as_its_first_query_would(
    app: tuple[SqlHarness, Engine],
) -> None:
    db, engine = app
    with Session(engine) as session:
        assert not session.in_transaction()
        enqueue(session, "app/later", 1, **db.table_options)
        assert session.in_transaction()
        session.rollback()
    assert db.jobs() == []


def test_a_job_enqueued_on_a_connection_commits_and_rolls_back_with_it(
    app: tuple[SqlHarness, Engine],
) -> None:
    db, engine = app
    with engine.connect() as conn:
        enqueue(conn, "app/dropped", 1, **db.table_options)
        conn.rollback()
        enqueue_many(conn, [("app/kept", 1)], **db.table_options)
        conn.commit()  # commits: enqueue began the Connection's transaction, as execute() would
    assert _job_types(db) == [":app/kept"]


def test_a_worker_runs_jobs_on_connections_of_the_engine(app: tuple[SqlHarness, Engine]) -> None:
    db, engine = app
    with Session(engine) as session, session.begin():
        enqueue(session, "app/work", {"n": 1}, **db.table_options)
    seen: list[tuple[str, Any]] = []
    assert process_next_job(engine, lambda t, p: seen.append((t, p)), **db.table_options) is True
    assert seen == [("app/work", {"n": 1})]
    assert db.jobs() == []
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_a_handlers_job_session_commits_and_rolls_back_with_its_job_on_the_engines_driver(
    app: tuple[SqlHarness, Engine],
) -> None:
    from proletarian_ref.integrations.sqlalchemy import job_session

    db, engine = app
    with Session(engine) as session, session.begin():
        enqueue(session, "app/ship", {"order": 7}, **db.table_options)
        enqueue(session, "app/broken", {"order": 8}, **db.table_options)

    def handler(job_type: str, payload: Any) -> None:
        with job_session(engine) as session:
            session.add(Order(id=payload["order"], item=job_type))
            session.flush()
        if job_type == "app/broken":
            raise RuntimeError("its order rolls back with it")

    while process_next_job(engine, handler, **db.table_options):
        pass
    assert _orders(engine) == ["app/ship"]
    assert sorted(a.status for a in db.archived_jobs()) == [":failure", ":success"]
    assert db.jobs() == []


def test_the_wrong_api_for_a_sqlalchemy_object_is_refused_by_name(app: tuple[SqlHarness, Engine]) -> None:
    db, engine = app
    async_session = AsyncSession(create_async_engine("postgresql+psycopg://nobody@127.0.0.1/none"))
    with pytest.raises(ConfigurationError, match=r"AsyncSession enqueues with proletarian_ref\.aio"):
        enqueue(async_session, "app/x", 1, **db.table_options)
    with Session(engine) as session, pytest.raises(ConfigurationError, match=r"not proletarian_ref\.aio"):
        asyncio.run(aio.enqueue(session, "app/x", 1, **db.table_options))
    with pytest.raises(ConfigurationError, match="takes a SQLAlchemy AsyncEngine"):
        asyncio.run(aio.process_next_job(engine, _async_noop, **db.table_options))
    assert db.jobs() == []


async def _async_noop(job_type: str, payload: Any) -> None:
    return None


# -- asyncio: AsyncSession, AsyncConnection and AsyncEngine on postgresql+psycopg and mysql+aiomysql --


@pytest.fixture
def async_app(request: pytest.FixtureRequest) -> Iterator[tuple[SqlHarness, str]]:
    dialect = request.param
    db: SqlHarness = request.getfixturevalue("pg_db" if dialect == "postgresql" else "mysql_db")
    dsn: str = request.getfixturevalue("pg_dsn" if dialect == "postgresql" else "mysql_dsn")
    suffix = db.job_table.rsplit("_", 1)[1]
    Order.__table__.name = f"sa_order_{suffix}"  # type: ignore[attr-defined]
    engine = create_engine(_url(dsn, dialect))
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        yield db, _url(dsn, dialect, _ASYNC_URL_SCHEMES)
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def test_async_session_and_connection_enqueue_in_their_transaction_and_flush_nothing(
    async_app: tuple[SqlHarness, str],
) -> None:
    db, url = async_app

    async def main() -> list[str]:
        engine = create_async_engine(url)
        flushes: list[object] = []
        try:
            async with AsyncSession(engine) as session:
                event.listen(session.sync_session, "before_flush", lambda *args: flushes.append(args))
                await session.begin()
                transaction = session.get_transaction()
                order = Order(id=5, item="async")
                session.add(order)
                await aio.enqueue(session, "app/async", {"order": 5}, **db.table_options)
                await aio.enqueue_many(session, [("app/many", 1)], **db.table_options)
                assert flushes == [] and order in session.new
                assert session.get_transaction() is transaction
                assert db.jobs() == []
                await session.commit()
                session.add(Order(id=6, item="dropped"))
                await aio.enqueue(session, "app/dropped", 6, **db.table_options)
                await session.rollback()
            async with engine.connect() as conn:
                await aio.enqueue(conn, "app/connection", 1, **db.table_options)
                await conn.commit()
                return [row.item for row in (await conn.execute(Order.__table__.select())).all()]
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == ["async"]
    assert _job_types(db) == [":app/async", ":app/connection", ":app/many"]


def test_the_async_worker_runs_jobs_on_connections_of_an_async_engine(
    async_app: tuple[SqlHarness, str],
) -> None:
    db, url = async_app
    seen: list[tuple[str, Any]] = []

    async def handler(job_type: str, payload: Any) -> None:
        seen.append((job_type, payload))

    async def main() -> None:
        engine: AsyncEngine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as session, session.begin():
                await aio.enqueue(session, "app/work", {"n": 2}, **db.table_options)
            assert await aio.process_next_job(engine, handler, **db.table_options) is True
            assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert seen == [("app/work", {"n": 2})]
    assert db.jobs() == []


def test_an_async_job_session_writes_in_the_jobs_transaction_and_rolls_back_with_its_failure(
    async_app: tuple[SqlHarness, str],
) -> None:
    from proletarian_ref.integrations.sqlalchemy import async_job_session

    db, url = async_app
    refused: list[BaseException] = []

    async def handler(job_type: str, payload: Any) -> None:
        async with async_job_session(engine) as session:
            session.add(Order(id=payload, item=job_type))
            await session.flush()
            if job_type == "app/fails":
                try:
                    await (await session.connection()).commit()
                except JobTransactionError as exc:
                    refused.append(exc)
                raise RuntimeError("rolled back with the job's transaction")

    async def main() -> list[str]:
        try:
            async with AsyncSession(engine) as session, session.begin():
                await aio.enqueue(session, "app/kept", 7, **db.table_options)
                await aio.enqueue(session, "app/fails", 8, **db.table_options)
            while await aio.process_next_job(engine, handler, **db.table_options):
                pass
            async with engine.connect() as conn:
                return [row.item for row in (await conn.execute(Order.__table__.select())).all()]
        finally:
            await engine.dispose()

    engine = create_async_engine(url)
    assert asyncio.run(main()) == ["app/kept"]
    assert sorted(row.status for row in db.archived_jobs()) == [":failure", ":success"]
    assert len(refused) == 1
