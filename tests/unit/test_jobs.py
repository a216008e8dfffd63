"""What a training job sets up before it trains (klsweep/submit/jobs.py)."""

from __future__ import annotations

import os

import pytest

from klsweep.submit.jobs import master_port


def test_the_rendezvous_port_is_the_jobs_own_and_below_the_ephemeral_ports(tmp_path):
    """Every task of a job draws the same port from the job id, below the kernel's ephemeral range (an outgoing
    connection held submitit's port once: rank 0 could not listen and rank 1 waited on it)."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    ports = [master_port(str(job), str(ranges)) for job in range(2000)]
    assert all(20000 <= p < 32768 for p in ports)
    assert len(set(ports)) > 1500  # spread over the range, not one port for all jobs
    assert master_port("163", str(ranges)) == master_port("163", str(ranges))  # each task computes the same
    ranges.write_text("40000 60999\n")
    wide = [master_port(str(job), str(ranges)) for job in range(0, 40000, 7)]
    assert max(wide) >= 32768 and all(20000 <= p < 40000 for p in wide)  # below 40000 now
    assert all(20000 <= master_port(f"{job}_3", str(ranges)) < 40000 for job in range(2000))  # hashed
    assert 20000 <= master_port("1", str(tmp_path / "missing")) < 32768  # unreadable: the default range


def test_jobs_with_ids_closer_than_the_range_never_share_a_port(tmp_path):
    """#44: two jobs of several processes on one node (the paper's 4-GPU runs, two on an 8-GPU node) take ports
    of their own: Slurm's numeric job ids count through the range (hashed, 2 of 2000 jobs shared one)."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    for first in (1, 4_000_000, 123_456_789):
        ports = [master_port(str(job), str(ranges)) for job in range(first, first + 12768)]
        assert len(set(ports)) == 12768 and all(20000 <= p < 32768 for p in ports)


def test_a_one_process_run_holds_a_rendezvous_port_of_its_own(monkeypatch):
    """#44: TRL's colocate engine of a one-process run gets a port this process bound and holds (no other
    process can take it meanwhile), the same for every engine of the process; MASTER_PORT, and the rank and
    world size TRL sets, are put back after (a process started later does not inherit them); a MASTER_PORT the
    user set is kept."""
    import socket

    from klsweep import engines

    for key in engines.PROCESS_GROUP_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    with engines.own_rendezvous_port() as port:
        assert os.environ["MASTER_PORT"] == str(port) and os.environ["MASTER_ADDR"] == "localhost"
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("", port))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")  # as TRL sets them for vLLM
    assert not set(engines.PROCESS_GROUP_VARIABLES) & set(os.environ)  # as they were
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("", port))  # still held: the next engine of this process (a resume) takes it again
    with engines.own_rendezvous_port() as again:
        assert again == port
    monkeypatch.setenv("MASTER_PORT", "29999")
    with engines.own_rendezvous_port() as kept:
        assert kept is None and os.environ["MASTER_PORT"] == "29999"
