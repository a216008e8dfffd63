"""What a training job sets up before it trains (klsweep/submit/jobs.py)."""

from __future__ import annotations

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
    assert max(master_port(str(job), str(ranges)) for job in range(2000)) >= 32768  # below 40000 now
    assert all(master_port(str(job), str(ranges)) < 40000 for job in range(2000))
    assert 20000 <= master_port("1", str(tmp_path / "missing")) < 32768  # unreadable: the default range
