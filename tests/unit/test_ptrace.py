"""``ddptop doctor``'s check of what lets a process ptrace another (the capability, Yama).  (A real refusal,
recognised and said once per run: tests/integration/test_ptrace_e2e.py.)"""

from __future__ import annotations


def test_doctor_checks_the_capability_and_yama(tmp_path):
    from ddptop.core.tools.doctor.host import check_ptrace

    def root(cap_eff: int, scope: int | None):
        r = tmp_path / f"r{cap_eff}-{scope}"
        (r / "proc/self").mkdir(parents=True)
        (r / "proc/self/status").write_text(f"Name:\tx\nCapEff:\t{cap_eff:016x}\n")
        if scope is not None:
            (r / "proc/sys/kernel/yama").mkdir(parents=True)
            (r / "proc/sys/kernel/yama/ptrace_scope").write_text(f"{scope}\n")
        return r

    with_cap = 1 << 19
    assert check_ptrace(root(with_cap, 1)).status == "ok"
    row = check_ptrace(root(0, 1))
    assert row.status == "warn" and "SYS_PTRACE" in row.advice
    assert check_ptrace(root(0, None)).status == "ok"
    assert check_ptrace(root(with_cap, 3)).status == "fail"
