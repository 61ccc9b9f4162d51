import proletarian_ref as pr
def test_enqueue_runs(db):
    c = db.connect()
    pr.enqueue(c, "a/b", {"x": 1}, job_table=db.job_table)
    c.commit(); c.close()
    seen = []
    assert pr.process_next_job(db.data_source, lambda t, p: seen.append(p), **db.table_options) is True
    assert seen == [{"x": 1}]
    assert len(db.archived_jobs()) == 1 and db.jobs() == []
