"""vlmatch_lab.host: the host record every result of the rooms carries."""

from vlmatch_lab.host import cpu_flags, cpu_model, host


def test_the_host_record(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rec = host(note="shared CPU")
    assert rec["omp_num_threads"] == "1" and rec["note"] == "shared CPU" and rec["cores"] >= 1
    assert rec["cpu"] == cpu_model() and rec["flags"] == cpu_flags()
    assert "note" not in host() and all(f.startswith(("avx", "fma", "amx", "sse4_2", "f16c")) for f in cpu_flags())
