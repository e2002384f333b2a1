#!/usr/bin/env python3
"""End-to-end tests of the `mxmoe` command-line tool (tools/mxmoe), one case per CTest test.

Each case runs the built binary and checks exit status, stdout, stderr and the files it writes.
Every run uses the small CPU problem (--backend cpu) unless a case needs otherwise, so the cases take
seconds on any machine.

Run: python3 tests/cli/test_cli.py <build>/mxmoe CASE     (CTest: Cli.CASE, label unit)
     python3 tests/cli/test_cli.py <build>/mxmoe all
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

BIN = None
FAILURES = []


def run(*args, timeout=120):
    """(exit status, stdout, stderr, seconds) of `mxmoe ARGS`."""
    t0 = time.monotonic()
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def check(cond, what, detail=""):
    if not cond:
        FAILURES.append(what)
        print("FAIL: %s%s" % (what, ("\n" + detail.rstrip()) if detail else ""))
    else:
        print("ok:   %s" % what)


def expect(args, status, what, stderr_has=(), stdout_has=(), stdout_lacks=(), timeout=120):
    rc, out, err, secs = run(*args, timeout=timeout)
    detail = "command: mxmoe %s\nexit %d after %.1f s\nstdout tail:\n%s\nstderr tail:\n%s" % (
        " ".join(args), rc, secs, out[-1500:], err[-1500:])
    ok = rc == status and all(s in err for s in stderr_has) and all(s in out for s in stdout_has) and \
        not any(s in out for s in stdout_lacks)
    check(ok, "%s (exit %d)" % (what, status), "" if ok else detail)
    return rc, out, err, secs


def leftovers(folder):
    """Temporary files an interrupted or failed write would leave."""
    return [f for f in os.listdir(folder) if ".tmp-" in f]


def read_npy(path):
    """(header dict text, payload bytes) of a .npy v1.0 file; raises on a malformed one."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x93NUMPY\x01\x00", "bad magic"
    (hlen,) = struct.unpack("<H", data[8:10])
    header = data[10:10 + hlen].decode("latin1")
    shape = eval(header, {"False": False, "True": True})["shape"]  # a Python dict literal
    count = 1
    for d in shape:
        count *= d
    payload = data[10 + hlen:]
    assert len(payload) == 4 * count, (path, len(payload), count)  # every dumped dtype is 4 bytes
    return header, payload


# ---- cases -------------------------------------------------------------------------------------

def case_zero_tokens():
    """T = 0 runs and reports (it crashed with SIGSEGV in the fp64 check)."""
    for recipe in ("mxfp8", "bf16"):
        rc, out, err, _ = expect(["run", "--backend", "cpu", "--tokens", "0", "--recipe", recipe], 0,
                                 "run --tokens 0 --recipe %s passes" % recipe,
                                 stdout_has=("no values to compare", "result    PASS"))
    with tempfile.TemporaryDirectory() as tmp:
        j = os.path.join(tmp, "r.json")
        expect(["run", "--backend", "cpu", "--tokens", "0", "--skew", "--bias", "--json", j], 0,
               "run --tokens 0 --skew --bias with --json passes")
        if os.path.exists(j):
            d = json.load(open(j))
            zero = [c for c in d["checks"] if c["values"] == 0]
            check(d["pass"] and {c["output"] for c in zero} == {"y", "dx", "dprobs"} and all(c["pass"] for c in zero),
                  "T=0 JSON: y, dx, dprobs compare zero values and pass")


def case_small_tokens():
    """A correct run with a handful of tokens passes (dprobs over 1..12 values failed its relative bound)."""
    for n in range(1, 13):
        expect(["run", "--backend", "cpu", "--tokens", str(n), "--skew"], 0, "run --tokens %d --skew passes" % n,
               stdout_has=("result    PASS",))
    expect(["run", "--backend", "cpu", "--tokens", "5", "--recipe", "bf16"], 0, "run --tokens 5 --recipe bf16 passes")


def case_fp8_blockwise():
    """--recipe fp8_blockwise passes its checks (on the CPU; on a GPU with --pow2-scales, and with fp32
    scales where cuda_sm90 serves it); --pow2-scales is taken with it and refused with another recipe."""
    for extra in (["--backend", "cpu"], ["--pow2-scales"], []):  # the last two on the GPU where there is one
        expect(["run", "--tokens", "200", "--skew", "--bias", "--recipe", "fp8_blockwise"] + extra, 0,
               "run --recipe fp8_blockwise %s passes" % " ".join(extra),
               stdout_has=("fp64 reference", "result    PASS"))
    expect(["run", "--backend", "cpu", "--tokens", "8", "--recipe", "mxfp8", "--pow2-scales"], 2,
           "--pow2-scales with mxfp8 is a usage error", stderr_has=("pow2_scales",))
    expect(["bench", "--recipe", "bf16", "--pow2-scales"], 2, "bench --pow2-scales with bf16 is a usage error",
           stderr_has=("--pow2-scales is for",))


def case_output_paths():
    """Bad --json/--dump paths are refused before the run; a failed write is an error; files are atomic."""
    with tempfile.TemporaryDirectory() as tmp:
        small = ["run", "--backend", "cpu", "--tokens", "16"]
        # Refused before the run: nothing on stdout, exit 2, the path in the message.
        expect(small + ["--json", tmp], 2, "--json DIRECTORY refused before the run", stderr_has=(tmp,),
               stdout_lacks=("result",))
        missing = os.path.join(tmp, "no-such-folder", "r.json")
        expect(small + ["--json", missing], 2, "--json in a missing folder refused before the run",
               stderr_has=(missing,), stdout_lacks=("result",))
        if os.path.isdir("/proc"):
            expect(small + ["--json", "/proc/mxmoe-test.json"], 2, "--json /proc/x refused before the run",
                   stderr_has=("/proc/mxmoe-test.json",), stdout_lacks=("result",))
        a_file = os.path.join(tmp, "a-file")
        open(a_file, "w").close()
        expect(small + ["--dump", a_file], 2, "--dump onto a file refused before the run", stderr_has=(a_file,),
               stdout_lacks=("result",))
        expect(small + ["--dump", os.path.join(a_file, "sub")], 2, "--dump under a file refused before the run",
               stderr_has=(a_file,), stdout_lacks=("result",))
        # A full disk: the write fails, the exit status says so, the message names the path.
        if os.path.exists("/dev/full"):
            rc, out, err, _ = run(*small, "--json", "/dev/full")
            check(rc == 3 and "/dev/full" in err, "--json /dev/full fails with exit 3 naming the path",
                  "exit %d\nstderr: %s" % (rc, err[-800:]))
        # Good paths: complete files, no temporaries left, an existing file replaced whole.
        j = os.path.join(tmp, "r.json")
        with open(j, "w") as f:
            f.write("x" * 100000)
        os.mkdir(os.path.join(tmp, "dump"))
        d = os.path.join(tmp, "dump", "nested")
        expect(small + ["--json", j, "--dump", d], 0, "--json FILE --dump DIR (created) written")
        try:
            ok = json.load(open(j))["pass"] is True
        except Exception as e:  # noqa: BLE001
            ok = False
            print(e)
        check(ok, "--json replaced an existing file with the complete report")
        try:
            problem = json.load(open(os.path.join(d, "problem.json")))
            ok = problem["tokens"] == 16 and problem["recipe"] == "mxfp8" and problem["seed"] == 1
            for name in ("x", "offsets", "probs", "w1", "w2", "dy", "y", "dx", "dprobs", "dw1", "dw2"):
                read_npy(os.path.join(d, name + ".npy"))
        except Exception as e:  # noqa: BLE001
            ok = False
            print(e)
        check(ok, "--dump wrote problem.json and every .npy complete")
        check(not leftovers(tmp) and not leftovers(d), "no temporary files left behind",
              str(leftovers(tmp) + leftovers(d)))


def run_limited(args, file_size_limit):
    """(exit status, stdout, stderr) of `mxmoe ARGS` where no file may grow beyond file_size_limit
    bytes: a write past it fails with EFBIG (SIGXFSZ ignored), as on a full disk."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, preexec_fn=limit)
    return p.returncode, p.stdout, p.stderr


def case_edge_paths():
    """Output paths at their edges (issue 39 D6-D9): empty paths, --json inside or equal to --dump,
    missing parent folders (refused for both flags), a dump that fails part way (nothing left)."""
    small = ["run", "--backend", "cpu", "--tokens", "16"]
    with tempfile.TemporaryDirectory() as tmp:
        # D6: an empty path is a usage error, not an ignored flag.
        expect(small + ["--json", ""], 2, "--json '' refused", stderr_has=("--json",), stdout_lacks=("result",))
        expect(small + ["--dump", ""], 2, "--dump '' refused", stderr_has=("--dump",), stdout_lacks=("result",))
        # D7: one path for both, or the report inside the dump: refused before the run, nothing made.
        same = os.path.join(tmp, "same")
        expect(small + ["--dump", same, "--json", same], 2, "--dump and --json on one path refused before the run",
               stderr_has=("--json", same), stdout_lacks=("result",))
        inside = os.path.join(tmp, "d", "report.json")
        expect(small + ["--dump", os.path.join(tmp, "d"), "--json", inside], 2,
               "--json inside the --dump directory refused before the run", stderr_has=("--json", inside),
               stdout_lacks=("result",))
        check(os.listdir(tmp) == [], "nothing created by the refused runs", str(os.listdir(tmp)))
        # D8: a missing parent folder is refused for both flags and created for neither.
        for flag, path in (("--json", os.path.join(tmp, "no", "dir", "x.json")),
                           ("--dump", os.path.join(tmp, "no", "a", "b"))):
            expect(small + [flag, path], 2, "%s in a missing folder refused" % flag,
                   stderr_has=(flag, path, "does not exist"), stdout_lacks=("result",))
        check(not os.path.exists(os.path.join(tmp, "no")), "no folder created for a refused path")
        expect(["run", "--help"], 0, "run --help states the rule", stdout_has=("must exist",))
        # D9: a dump that fails part way (a file-size limit, as a full disk) leaves nothing behind; an
        # earlier dump in the same place is kept whole.
        d = os.path.join(tmp, "dump")
        rc, out, err = run_limited(small + ["--dump", d], 4096)
        check(rc == 3 and "--dump" in err, "a failed dump exits 3 naming --dump", "exit %d\nstderr: %s" % (rc, err[-800:]))
        check(not os.path.exists(d) and not leftovers(tmp), "a failed dump leaves nothing",
              str(os.listdir(tmp)))
        expect(small + ["--dump", d], 0, "a dump into a fresh directory")
        before = sorted(os.listdir(d))
        rc, out, err = run_limited(small + ["--seed", "2", "--dump", d], 4096)
        check(rc == 3, "the second dump fails", err[-800:])
        check(sorted(os.listdir(d)) == before and json.load(open(os.path.join(d, "problem.json")))["seed"] == 1 and
              not leftovers(tmp), "the earlier dump is kept whole", str(os.listdir(tmp)))
        expect(small + ["--seed", "3", "--dump", d], 0, "a dump replaces an earlier dump")
        check(json.load(open(os.path.join(d, "problem.json")))["seed"] == 3 and sorted(os.listdir(d)) == before and
              not leftovers(tmp), "the replaced dump is the new one, nothing else left", str(os.listdir(tmp)))
        # A folder holding anything but a dump is never replaced.
        other = os.path.join(tmp, "mine")
        os.mkdir(other)
        open(os.path.join(other, "notes.txt"), "w").close()
        expect(small + ["--dump", other], 2, "--dump into a folder with other files refused",
               stderr_has=("--dump", other, "notes.txt"), stdout_lacks=("result",))
        check(os.listdir(other) == ["notes.txt"], "the other folder is untouched")


def run_on_terminal(args, timeout=120):
    """Everything `mxmoe ARGS` writes to a pseudo-terminal (stdout and stderr both)."""
    import pty
    import select
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(BIN, [BIN, *args])
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace")


def case_new_user():
    """What confused a new user (issue 39): the reason CUDA is absent, the problem as given, the
    clamped note on the CPU, memory refusals that suggest what fits, progress on a terminal only,
    one exit status for a bad backend name whichever way it is given."""
    import re
    rc, out, err, _ = run("info")
    build = [l for l in out.splitlines() if l.startswith("build:")]
    m = re.search(r"cuda: not built \(([^)]*)\)", build[0]) if build else None
    if "cuda: not built" in out:
        check(m is not None, "info's build line says why CUDA is not built", out[-600:])
        if m:
            cuda_lines = [l for l in out.splitlines() if l.strip().startswith("cuda_")]
            check(cuda_lines and all(m.group(1) in l for l in cuda_lines),
                  "every CUDA backend gives the build's reason (%s)" % m.group(1), "\n".join(cuda_lines))
    # The problem as given: flags named as given, the preset only for what it filled in.
    expect(["run", "--backend", "cpu", "--hidden", "128", "--tokens", "8"], 0, "--hidden alone",
           stdout_has=("given: H=128 T=8; from preset small (the default): F=256 E=8",))
    rc, out, err, _ = expect(["run", "--backend", "cpu", "--hidden", "64", "--ffn", "64", "--experts", "2",
                              "--tokens", "8", "--activation", "swiglu", "--glu-layout", "halves"], 0,
                             "every size given", stdout_has=("given: H=64 F=64 E=2 T=8 activation=swiglu glu=halves",))
    check("preset" not in out.split("  tokens")[0], "no preset named when none was used", out[:400])
    expect(["run", "--backend", "cpu", "--tokens", "8", "--activation", "clamped_swiglu"], 0,
           "clamped SwiGLU on the CPU", stdout_lacks=("the same-points check is authoritative",),
           stdout_has=("here the loose fp64 bound is the only check",))
    # Refusals suggest what fits, from the estimate's own terms.
    rc, out, err, _ = expect(["run", "--backend", "cpu", "--tokens", "2000000000"], 3,
                             "too many tokens: refused with a --tokens that fits", stderr_has=("(or fewer) fits",))
    fit = re.search(r"--tokens (\d+) \(or fewer\) fits", err)
    check(fit is not None and 0 < int(fit.group(1)) < 2000000000 and "--check-rows" not in err,
          "the suggestion is a smaller --tokens, not --check-rows", err[-400:])
    rc, out, err, _ = expect(["run", "--backend", "cpu", "--preset", "dsv3", "--experts", "65536", "--tokens", "10"],
                             3, "too many experts: refused with an --experts that fits", stderr_has=("--experts ",))
    check(re.search(r"--experts \d+ (--tokens 1 )?\(or fewer\) fits", err) is not None, "names a number of experts",
          err[-400:])
    # Progress: quiet in a pipe; on a terminal each phase, with a time estimate on a longer run.
    rc, out, err, _ = run("run", "--backend", "cpu", "--tokens", "8")
    check(rc == 0 and "mxmoe:" not in err, "no progress lines when stderr is not a terminal", err[-400:])
    # Long enough that the fp64 reference's estimate is seconds on any machine (a phase estimated under
    # half a second shows only its time).
    text = run_on_terminal(["run", "--backend", "cpu", "--tokens", "8192"])
    check("mxmoe: fp64 reference" in text and re.search(r"about \d+(\.\d)? s left", text) is not None and
          "result    PASS" in text, "on a terminal: phases with the time left", text[-1500:])
    # One exit status for an unknown backend, flag or environment.
    for env in ({"MXMOE_BACKEND": "bogus"}, {"MXMOE_DENY": "cpu,bogus"}):
        p = subprocess.run([BIN, "run", "--tokens", "8"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, **env))
        check(p.returncode == 2 and "bogus" in p.stderr and list(env)[0] in p.stderr,
              "%s: exit 2 naming the variable" % list(env)[0], "exit %d: %s" % (p.returncode, p.stderr[-300:]))


def case_memory_and_bounds():
    """Absurd sizes are refused at once: out-of-range flags by name, too-big runs with the estimate."""
    expect(["run", "--experts", "5000000"], 2, "--experts 5000000 out of range",
           stderr_has=("--experts", "5000000"))
    expect(["run", "--hidden", "1000000"], 2, "--hidden 1000000 out of range", stderr_has=("--hidden", "1000000"))
    expect(["run", "--ffn", "0"], 2, "--ffn 0 out of range", stderr_has=("--ffn", "'0'"))
    expect(["run", "--tokens", "3000000000"], 2, "--tokens 3000000000 out of range",
           stderr_has=("--tokens", "3000000000"))
    expect(["run", "--tokens", "-1"], 2, "--tokens -1 out of range", stderr_has=("--tokens", "-1"))
    expect(["run", "--check-rows", "0"], 2, "--check-rows 0 out of range", stderr_has=("--check-rows",))
    expect(["run", "--seed", "-1"], 2, "--seed -1 rejected", stderr_has=("--seed",))
    # ~100 TB: more than any machine has; refused before any allocation, so within seconds.
    rc, out, err, secs = expect(["run", "--backend", "cpu", "--preset", "dsv3", "--experts", "65536", "--tokens", "10"],
                                3, "a run larger than memory refused with the estimate",
                                stderr_has=("needs about", "GiB", "available"), timeout=60)
    check(secs < 30, "the refusal comes before the run (%.1f s)" % secs)


def case_usage():
    """Every command-line mistake exits 2; --version and `version` exist."""
    expect(["run", "--backend", "tpu"], 2, "--backend tpu is a usage error", stderr_has=("tpu", "--backend"))
    expect(["run", "--deny", "bogus"], 2, "--deny bogus is a usage error", stderr_has=("bogus",))
    expect(["run", "--deny", "cpu,bogus"], 2, "--deny cpu,bogus is a usage error", stderr_has=("bogus",))
    expect(["info", "--deny", "bogus"], 2, "info --deny bogus is a usage error", stderr_has=("bogus",))
    expect(["run", "--recipe", "fp4"], 2, "--recipe fp4 is a usage error", stderr_has=("--recipe", "fp4"))
    expect(["run", "--preset", "nope"], 2, "--preset nope is a usage error", stderr_has=("--preset", "nope"))
    expect(["run", "--frobnicate"], 2, "an unknown flag is a usage error", stderr_has=("--frobnicate",))
    expect(["run", "--json"], 2, "a flag without its value is a usage error", stderr_has=("--json",))
    expect(["frobnicate"], 2, "an unknown command is a usage error", stderr_has=("frobnicate",))
    expect([], 2, "no command is a usage error")
    expect(["bench", "--hidden", "512"], 2, "bench rejects the run's problem flags", stderr_has=("--hidden",))
    expect(["bench", "--dump", "x"], 2, "bench rejects --dump", stderr_has=("--dump",))
    expect(["info", "--preset", "dsv3"], 2, "info rejects run flags", stderr_has=("--preset",))
    rc, info_out, _, _ = run("info")
    version_line = info_out.splitlines()[0] if info_out else ""
    expect(["--version"], 0, "--version prints the version", stdout_has=(version_line,))
    expect(["version"], 0, "version prints the version", stdout_has=(version_line,))
    check(version_line.startswith("mxmoe ") and len(version_line) > 6, "info names the version: %r" % version_line)
    rc, out, err, _ = expect(["run", "--help"], 0, "run --help lists the run flags",
                             stdout_has=("--tokens", "--json", "--dump", "--check-rows", "--deny"))
    expect(["bench", "--help"], 0, "bench --help lists the bench flags", stdout_has=("--preset", "--json"),
           stdout_lacks=("--tokens", "--dump"))
    expect(["--help"], 0, "--help lists the commands", stdout_has=("info", "run", "bench", "version"))
    expect(["help", "run"], 0, "help run is run --help", stdout_has=("--tokens",))
    # --flag=value still works.
    expect(["run", "--backend=cpu", "--tokens=8", "--recipe=bf16"], 0, "--flag=value form accepted")


def case_json_fields():
    """The report's JSON keeps every field name scripts read."""
    with tempfile.TemporaryDirectory() as tmp:
        j = os.path.join(tmp, "r.json")
        expect(["run", "--backend", "cpu", "--tokens", "64", "--bias", "--json", j], 0, "run --json")
        d = json.load(open(j))
        top = ["preset", "seed", "problem", "token_split", "device", "steps", "forward", "backward", "saved_bytes",
               "checks", "notes", "pass"]
        check(all(k in d for k in top), "top-level fields", str(sorted(d)))
        check(all(k in d["problem"] for k in ("hidden", "ffn", "experts", "tokens", "activation", "glu_layout",
                                               "recipe", "fc1_bias", "fc2_bias", "scale_fc2_bias", "weight_layout",
                                               "description")), "problem fields", str(sorted(d["problem"])))
        check(all(k in d["token_split"] for k in ("kind", "min", "max", "empty_experts")), "token_split fields")
        check(all(set(s) >= {"step", "backend", "skipped"} for s in d["steps"]) and d["steps"], "step fields")
        check(set(d["forward"]) >= {"seconds", "tflops"} and set(d["backward"]) >= {"seconds", "tflops"},
              "timing fields")
        check(all(set(c) >= {"kind", "output", "scope", "error", "tolerance", "pass"} for c in d["checks"]) and
              {c["output"] for c in d["checks"]} >= {"y", "dx", "dprobs", "dw1", "dw2", "db1", "db2"},
              "check fields")
        version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.split()[-1]
        check(d.get("mxmoe_version") == version, "the report carries the library version",
              "%r vs --version %r" % (d.get("mxmoe_version"), version))


def build_has(backend, arch="sm_90a"):
    """Whether this build has `backend`'s kernels: its plan for `arch` does not refuse it as "not built"
    or "built without CUDA" (`mxmoe info` would give the GPU's reason instead on a machine with one)."""
    out = subprocess.run([BIN, "plan", "--arch", arch, "--preset", "small"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    return not any(("not %s:" % backend in l or "%s:" % backend in l) and ("not built" in l or "without CUDA" in l)
                   for l in text.splitlines())


GEMM_STEPS = ("fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_dgrad", "fc2_wgrad", "fc1_wgrad")


def case_plan():
    """`mxmoe plan` prints every step of a training step for any target, without a GPU; --json too."""
    presets = ("dsv3", "qwen3-30b", "gptoss-120b", "mixtral", "small")
    if not build_has("cuda_portable"):  # a build without CUDA plans the CPU only, and says why not a GPU
        expect(["plan", "--arch", "sm_90a"], 3, "a GPU target in a build without CUDA",
               stderr_has=("built without CUDA",))
        expect(["plan", "--arch", "cpu"], 0, "plan for the CPU", stdout_has=("fc1_fprop",))
        return
    for arch in ("sm_80", "sm_90a", "sm_100a", "cpu"):
        for recipe in ("mxfp8", "bf16", "fp8_blockwise"):
            for preset in presets:
                extra = ["--pow2-scales"] if recipe == "fp8_blockwise" and arch in ("sm_80", "sm_100a") else []
                rc, out, err, _ = expect(["plan", "--arch", arch, "--preset", preset, "--recipe", recipe] + extra, 0,
                                         "plan %s %s %s" % (arch, preset, recipe))
                rows = [l for l in out.splitlines() if l and not l.startswith(" ")]
                steps = [r.split()[0] for r in rows[2:-1]]
                check(all(s in steps for s in GEMM_STEPS), "every GEMM step has a row (%s %s %s)" %
                      (arch, preset, recipe), out[-800:])
    # Which backend serves which GEMM, where this build has it.
    if build_has("cuda_sm90"):
        rc, out, err, _ = run("plan", "--arch", "sm_90a", "--preset", "dsv3", "--recipe", "mxfp8")
        for step in GEMM_STEPS:
            row = next(l for l in out.splitlines() if l.startswith(step + " "))
            check(row.split()[1] == "cuda_sm90", "sm_90a mxfp8: %s on cuda_sm90" % step, row)
        fc2_dgrad = next(l for l in out.splitlines() if l.startswith("fc2_dgrad "))
        check(fc2_dgrad.split()[2] == "mxfp8_dequant_n256", "dsv3's MXFP8 FC2 dgrad (K = 7168) dequantizes A",
              fc2_dgrad)
        expect(["plan", "--arch", "sm_90a", "--preset", "dsv3", "--override", "fc2_dgrad=mxfp8_regs_n128"], 0,
               "an override names the configuration", stdout_has=("mxfp8_regs_n128",))
        expect(["plan", "--arch", "sm_90a", "--preset", "dsv3", "--override", "fc2_dgrad=nonsense"], 3,
               "an unknown configuration is an error naming the override and the known ones",
               stderr_has=("options.overrides", "fc2_dgrad=nonsense", "mxfp8_dequant_n128"))
    if build_has("cuda_sm100", "sm_100a"):
        rc, out, err, _ = run("plan", "--arch", "sm_100a", "--preset", "dsv3", "--recipe", "mxfp8")
        for step in ("fc2_fprop", "fc1_dgrad", "fc2_wgrad", "fc1_wgrad"):
            row = next(l for l in out.splitlines() if l.startswith(step + " "))
            check(row.split()[1] == "cuda_sm100", "sm_100a mxfp8: %s on cuda_sm100" % step, row)
    rc, out, err, _ = run("plan", "--arch", "sm_80", "--preset", "qwen3-30b", "--recipe", "bf16")
    check(all(next(l for l in out.splitlines() if l.startswith(s + " ")).split()[1] == "cuda_portable"
              for s in GEMM_STEPS), "sm_80: every GEMM on cuda_portable", out[-800:])
    expect(["plan", "--arch", "sm_75"], 2, "an unknown --arch is a usage error", stderr_has=("--arch", "sm_75"))
    expect(["plan", "--arch", "sm_90a", "--override", "fc2_dgrad"], 2, "--override needs STEP=CONFIG",
           stderr_has=("STEP=CONFIG",))
    with tempfile.TemporaryDirectory() as tmp:
        j = os.path.join(tmp, "plan.json")
        expect(["plan", "--arch", "sm_90a", "--preset", "mixtral", "--prepared", "--json", j], 0, "plan --json")
        d = json.load(open(j))
        check(d["target"] == "sm_90a" and d["problem"]["preset"] == "mixtral", "plan JSON: target and problem")
        check(all(set(s) >= {"step", "backend", "config", "workspace_bytes", "weights", "launches", "skipped"}
                  for s in d["steps"]), "plan JSON: step fields")
        check(any(s["step"].startswith("prepare.") for s in d["steps"]), "--prepared plans prepare_weights too")


CASES = {
    "plan": case_plan,
    "zero_tokens": case_zero_tokens,
    "small_tokens": case_small_tokens,
    "fp8_blockwise": case_fp8_blockwise,
    "output_paths": case_output_paths,
    "edge_paths": case_edge_paths,
    "new_user": case_new_user,
    "memory_and_bounds": case_memory_and_bounds,
    "usage": case_usage,
    "json_fields": case_json_fields,
}


def main():
    global BIN
    if len(sys.argv) != 3 or (sys.argv[2] not in CASES and sys.argv[2] != "all"):
        print("usage: test_cli.py MXMOE_BINARY CASE|all   (cases: %s)" % ", ".join(CASES))
        return 2
    BIN = os.path.abspath(sys.argv[1])
    for name, case in CASES.items():
        if sys.argv[2] in (name, "all"):
            print("== %s" % name)
            try:
                case()
            except Exception as e:  # noqa: BLE001 - a crash of the case is a failure, with its reason
                FAILURES.append("%s raised %r" % (name, e))
                print("FAIL: %s raised %r" % (name, e))
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
