#!/usr/bin/python3
"""A peer let in after the job's end (issue 21: "starting at round 15, ending at round 14",
then round 531 of 14) has no round to run: Node.start leaves running False and the peer does
not train. A member of a 3-round job stays in the job after its end; a joiner comes then.

    test_late_join.py                 the test (spawns both peers, kills them by PID)
    test_late_join.py member PORT     one peer of a 3-round job, in it until stdin closes
    test_late_join.py joiner PORT     joins through PORT, says what start decided
"""
import os
import socket
import subprocess
import sys

import numpy as np

import hearsay

IP = os.environ.get("HS_TEST_IP", "127.0.0.1")
D = 16


def member(port):
    x = np.zeros(D, dtype=np.float32)
    with hearsay.Node(world=1, insecure=True, listen=f"{IP}:{port}", rounds=3, quiet=True) as n:
        n.start(x)
        while n.step(x):
            pass
        print("ended", flush=True)
        sys.stdin.read()  # the job's last member stays until the joiner is done
    return 0


def joiner(port):
    x = np.ones(D, dtype=np.float32)
    with hearsay.Node(world=1, insecure=True, listen=f"{IP}:0", bootstrap=f"{IP}:{port}",
                      rounds=3, quiet=True) as n:
        n.start(x)
        steps = 0
        # Bounded: before the fix the joiner stepped for ever.
        while n.running and steps < 20 and n.step(x):
            steps += 1
        print(f"running_at_start {int(steps > 0 or n.running)} steps {steps} "
              f"round {n.round}", flush=True)
    return 0


def free_port():
    with socket.socket() as s:
        s.bind((IP, 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    me = os.path.abspath(__file__)
    procs = []
    try:
        m = subprocess.Popen([sys.executable, me, "member", str(port)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        procs.append(m)
        line = m.stdout.readline()
        assert line.strip() == "ended", f"member said {line!r}"
        j = subprocess.Popen([sys.executable, me, "joiner", str(port)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append(j)
        out, err = j.communicate(timeout=30)
        assert j.returncode == 0, f"joiner exit {j.returncode}: {err}"
        words = out.split()
        assert words[:4] == ["running_at_start", "0", "steps", "0"], out + err
        m.stdin.close()
        assert m.wait(timeout=30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, 9)
                p.wait()
    print("ok")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3:
        sys.exit((member if sys.argv[1] == "member" else joiner)(int(sys.argv[2])))
    sys.exit(main())
