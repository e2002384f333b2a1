#!/usr/bin/env python3
"""cuda_sm100's objects carry Blackwell's block-scaled tensor-core MMA: `cuobjdump -sass` of each
object shows UTCQMMA (the 2-SM kernel UTCQMMA.2CTA) and the scale-factor copies into tensor memory
(UTCCP). cuobjdump and nvdisasm come from the toolkit or from the pinned PyPI wheels that
scripts/setup.sh installs into .venv (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).

    check_sass.py OBJECT...      (exit 0: every GEMM object has them; 1: one lacks them; 77: no cuobjdump)

Only the GEMM translation units (gemm_m_*sm.cu, gemm_k_*sm.cu) are checked; the others (the host
entries, the scale repack) carry no MMA.
"""
import glob
import os
import re
import shutil
import subprocess
import sys


def find_tools():
    dirs = [os.path.dirname(shutil.which("cuobjdump") or "")] if shutil.which("cuobjdump") else []
    dirs += ["/usr/local/cuda/bin"]
    here = os.path.dirname(os.path.abspath(__file__))
    dirs += glob.glob(os.path.join(here, "..", "..", ".venv", "lib", "python3*", "site-packages", "nvidia", "cu13", "bin"))
    for d in dirs:
        if os.path.exists(os.path.join(d, "cuobjdump")) and os.path.exists(os.path.join(d, "nvdisasm")):
            return d
    return None


GEMM_OBJECT = re.compile(r"^gemm_[mk]_\w*sm\.cu\.o(bj)?$")


def main(objects):
    objects = [o for o in objects if GEMM_OBJECT.match(os.path.basename(o))]
    if not objects:
        print("no GEMM object (gemm_[mk]_*sm.cu) among the arguments")
        return 1
    tools = find_tools()
    if tools is None:
        print("SKIPPED: no cuobjdump + nvdisasm (toolkit or .venv wheels) to disassemble the sm100 objects")
        return 77
    env = dict(os.environ, PATH=tools + os.pathsep + os.environ.get("PATH", ""))
    ok = True
    for obj in objects:
        out = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", obj], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{obj}: cuobjdump failed: {out.stderr.strip()[:300]}")
            ok = False
            continue
        ops = re.findall(r"\b(UTCQMMA(?:\.2CTA)?|UTCCP\S*|UTCHMMA\S*)", out.stdout)
        counts = {op: ops.count(op) for op in sorted(set(ops))}
        arch = "sm_100a" if "sm_100a" in out.stdout else "?"
        print(f"{os.path.basename(obj)} ({arch}): {counts}")
        two_sm = "2sm" in os.path.basename(obj)
        want = "UTCQMMA.2CTA" if two_sm else "UTCQMMA"
        if counts.get(want, 0) == 0 or not any(op.startswith("UTCCP") for op in counts) or arch != "sm_100a":
            print(f"{obj}: expected {want} and UTCCP in sm_100a SASS")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    # CTest passes $<TARGET_OBJECTS:...> as one ;-separated argument.
    sys.exit(main([p for a in sys.argv[1:] for p in a.split(";") if p]))
