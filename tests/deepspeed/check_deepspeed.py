#!/usr/bin/env python3
"""Runs ds_workload.py with and without pinshim and checks what happened.

  check_deepspeed.py --python VENV/bin/python --shim-command build/src/pinshim
                     --fake build/tests/fake_cudart/libfake_cudart.so --workdir DIR
                     [--aio-cycles 50] [--native-cycles 10] [--only aio|native]

Six runs: each path (aio, native) without the shim, under the shim with its
registration thread (PINSHIM_ASYNC=on) and registering inside mlock (off).
The shim runs go through the pinshim command with its default context mode
(PINSHIM_CONTEXT=program: the workload initialises CUDA first, as a GPU process
does, and the shim registers into that context through the double's driver;
--cudart names the double, which the program also loaded). Every run logs the double's calls (FAKE_CUDART_LOG) with
the workload's marks in between; the checks read that log, the shim's stats
and the workload's result and report. It prints what happened in numbers,
one PASS/FAIL line per check, and last 'deepspeed: N passed, N failed'.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "ds_workload.py")
MiB = 1 << 20
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
REGISTRATION_WARNING = "Native pinned-memory device registration failed"

RUNS = [("aio", None), ("aio", "on"), ("aio", "off"), ("native", None), ("native", "on"), ("native", "off")]


def run_name(path, shim):
    return f"{path}-{'noshim' if shim is None else 'async-' + shim}"


def label(shim):
    return "without the shim" if shim is None else f"pinshim, PINSHIM_ASYNC={shim}"


def clean_environment():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PINSHIM_", "FAKE_CUDART_", "DS_")) and k != "LD_PRELOAD"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_one(args, path, shim):
    name = run_name(path, shim)
    directory = os.path.join(args.workdir, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    env = clean_environment()
    env.update(DS_ACCELERATOR="cpu", PINSHIM_DS_FAKE_CUDART=args.fake,
               FAKE_CUDART_LOG=os.path.join(directory, "fake.log"))
    if args.torch_extensions:
        env["TORCH_EXTENSIONS_DIR"] = args.torch_extensions
    if path == "native":
        env.update(DS_PIN_MEMORY_BACKEND="native", DS_PIN_MEMORY_REGISTER_DEVICE="1")
    cycles = args.aio_cycles if path == "aio" else args.native_cycles
    command = [args.python, WORKLOAD, path, "--result", os.path.join(directory, "result.txt"),
               "--report", os.path.join(directory, "report.json"), "--workdir", directory,
               "--cycles", str(cycles)]
    if shim is not None:
        command = [args.shim_command, f"--stats={directory}/stats.%p.json",
                   "--async", shim, "--cudart", args.fake, "--"] + command
    started = time.perf_counter()
    with open(os.path.join(directory, "output.txt"), "w") as output:
        try:
            rc = subprocess.run(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - started
    return analyse(directory, path, shim, rc, wall, cycles)


def read_log(path):
    events = []
    if not os.path.exists(path):
        return events
    with open(path) as f:
        for line in f:
            fields = line.split()
            if not fields:
                continue
            kind, pid = fields[0], int(fields[1])
            if kind == "register":
                events.append(dict(kind=kind, pid=pid, ptr=int(fields[2], 16), size=int(fields[3]),
                                   err=int(fields[5])))
            elif kind == "unregister":
                events.append(dict(kind=kind, pid=pid, ptr=int(fields[2], 16), err=int(fields[3])))
            elif kind == "violation":
                events.append(dict(kind=kind, pid=pid, what=fields[2], ptr=int(fields[3], 16),
                                   size=int(fields[4])))
            elif kind == "getlasterror":
                events.append(dict(kind=kind, pid=pid, err=int(fields[2])))
            elif kind == "mark":
                events.append(dict(kind=kind, pid=pid, event=fields[2], ptr=int(fields[3], 16),
                                   size=int(fields[4]), tag=fields[5]))
    return events


def simulate(events):
    """Follows the runtime's registrations and the workload's buffers in one
    order: which registration calls belong to which buffer, and what was
    registered when a buffer came back to the program and after its release."""
    pid = next((e["pid"] for e in events if e["kind"] == "mark" and e["event"] == "start"), None)
    result = dict(pid=pid, other_pids=sorted({e["pid"] for e in events} - {pid}), instances=[],
                  register_ok=0, register_failed={}, unregister_ok=0, unregister_failed={}, violations=[],
                  getlasterror=0, stray=[], live_at_end={}, exact=True)
    live = {}
    group_begin = {}
    open_instances = {}
    index_events = []
    for index, e in enumerate(events):
        if e["pid"] != pid:
            continue
        kind = e["kind"]
        if kind == "mark":
            if e["event"] == "alloc-begin":
                group_begin[e["tag"]] = index
            elif e["event"] == "alloc-end":
                registered = live.get(e["ptr"])
                pages = -(-e["size"] // PAGE_BYTES) * PAGE_BYTES
                inst = dict(ptr=e["ptr"], size=e["size"], tag=e["tag"], begin=group_begin.get(e["tag"], index),
                            end=None, live_when_returned=registered == e["size"],
                            # The shim's registration of the buffer's pages,
                            # handed over to DeepSpeed (issue 17).
                            pages_when_returned=registered is not None
                            and e["size"] <= registered <= pages,
                            live_after_release=None, reg_ok=0, reg_failed=0, unreg_ok=0, unreg_failed=0,
                            inexact=0)
                open_instances[e["ptr"]] = inst
                result["instances"].append(inst)
            elif e["event"] == "free-end":
                inst = open_instances.pop(e["ptr"], None)
                if inst is not None:
                    inst["end"] = index
                    lo, hi = inst["ptr"], inst["ptr"] + inst["size"]
                    inst["live_after_release"] = any(b < hi and b + s > lo for b, s in live.items())
        elif kind == "register":
            if e["err"] == 0:
                result["register_ok"] += 1
                live[e["ptr"]] = e["size"]
            else:
                result["register_failed"][e["err"]] = result["register_failed"].get(e["err"], 0) + 1
            index_events.append((index, e))
        elif kind == "unregister":
            if e["err"] == 0:
                result["unregister_ok"] += 1
                live.pop(e["ptr"], None)
            else:
                result["unregister_failed"][e["err"]] = result["unregister_failed"].get(e["err"], 0) + 1
            index_events.append((index, e))
        elif kind == "violation":
            result["violations"].append(e)
        elif kind == "getlasterror":
            result["getlasterror"] += 1
    result["live_at_end"] = dict(live)
    by_ptr = {}
    for inst in result["instances"]:
        by_ptr.setdefault(inst["ptr"], []).append(inst)
    for index, e in index_events:
        owner = None
        for inst in by_ptr.get(e["ptr"], []):
            if inst["begin"] <= index and (inst["end"] is None or index <= inst["end"]):
                owner = inst
        if owner is None:
            result["stray"].append(e)
            continue
        if e["kind"] == "register":
            owner["reg_ok" if e["err"] == 0 else "reg_failed"] += 1
            if e["err"] == 0 and e["size"] != owner["size"]:
                owner["inexact"] += 1
        else:
            owner["unreg_ok" if e["err"] == 0 else "unreg_failed"] += 1
    return result


def read_stats(directory, pid):
    files = glob.glob(os.path.join(directory, "stats.*.json"))
    mine = [f for f in files if f.endswith(f".{pid}.json")]
    others = [f for f in files if f not in mine]
    stats = None
    if mine:
        with open(mine[0]) as f:
            stats = json.load(f)
    return stats, others


def analyse(directory, path, shim, rc, wall, cycles):
    events = read_log(os.path.join(directory, "fake.log"))
    sim = simulate(events)
    stats, other_stats = read_stats(directory, sim["pid"])
    result_path = os.path.join(directory, "result.txt")
    result = open(result_path).read() if os.path.exists(result_path) else None
    report_path = os.path.join(directory, "report.json")
    report = json.load(open(report_path)) if os.path.exists(report_path) else {}
    output = open(os.path.join(directory, "output.txt"), errors="replace").read()
    shim_lines = [line for line in output.splitlines() if line.startswith("pinshim:")]
    return dict(path=path, shim=shim, rc=rc, wall=wall, cycles=cycles, sim=sim, stats=stats,
                other_stats=other_stats, result=result, report=report, shim_lines=shim_lines,
                directory=directory, output_tail=output[-3000:])


class Checks:

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.lines = []

    def __call__(self, ok, text, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        self.lines.append(f"{'PASS' if ok else 'FAIL'}  {text}" + (f"  [{detail}]" if detail and not ok else ""))
        return ok


def seconds(value):
    return f"{value:.1f} s"


def describe(run):
    """Numbers for a person: one block per run."""
    sim, stats, report = run["sim"], run["stats"], run["report"]
    instances = sim["instances"]
    lines = [f"  {label(run['shim'])}: exit {run['rc']}, {seconds(run['wall'])} wall "
             f"(workload {seconds(report.get('seconds', 0))}, start-up {seconds(report.get('startup_seconds', 0))})"]
    total = sum(i["size"] for i in instances)
    lines.append(f"    buffers {len(instances)} ({total / MiB:.0f} MiB locked in all); the runtime's log: "
                 f"{sim['register_ok']} cudaHostRegister ok, {sum(sim['register_failed'].values())} failed"
                 f"{' ' + str(sim['register_failed']) if sim['register_failed'] else ''}, "
                 f"{sim['unregister_ok']} cudaHostUnregister ok, "
                 f"{sum(sim['unregister_failed'].values())} failed, {len(sim['violations'])} violations")
    if stats:
        reg, unreg, prog, thread, live = (stats["register"], stats["unregister"], stats["program"],
                                          stats.get("thread", {}), stats["live"])
        lines.append(f"    shim: registered {reg['ok']} ({reg['bytes'] / MiB:.0f} MiB, {reg['seconds']:.3f} s inside "
                     f"cudaHostRegister), failed {reg['failed']}, already registered {reg['already_registered']}; "
                     f"unregistered {unreg['ok']} (munlock {unreg['munlock']}, free {unreg['free']}, "
                     f"munmap {unreg['munmap']}, given up to the program {unreg['program']}, exit {unreg['exit']})")
        lines.append(f"    program (DeepSpeed) through the shim: registrations {prog['registrations']}, "
                     f"unregistrations {prog['unregistrations']}, taken back by the shim {prog['taken_back']}; "
                     f"thread: cancelled {thread.get('cancelled', 0)}, queued at exit {thread.get('queued_at_exit', 0)}; "
                     f"live at exit {live['ranges']} ({live['bytes']} B), peak {live['peak_bytes'] / MiB:.0f} MiB; "
                     f"warnings {stats.get('warnings')}, errors {stats.get('errors') or 'none'}")
    if report.get("shim_held_at_first_use"):
        lines.append(f"    the shim held the buffer when DeepSpeed first used it: {report['shim_held_at_first_use']}")
    if report.get("shim_held_right_after_pin"):
        lines.append(f"    the shim held the buffer right after DeepSpeed's pin returned (DeepSpeed owns it then): "
                     f"{report['shim_held_right_after_pin']}")
    if report.get("shim_held_at_cycle_end"):
        values = report["shim_held_at_cycle_end"]
        lines.append(f"    buffers the shim held at the end of each cycle: min {min(values)}, max {max(values)} "
                     f"of {report.get('buffers_per_cycle')}")
    timers = report.get("timers", {})
    if timers:
        lines.append("    time in DeepSpeed calls: " + "; ".join(
            f"{name} {t['calls']} x {1000 * t['seconds'] / max(t['calls'], 1):.2f} ms" for name, t in timers.items()))
    if report.get("global_scope"):
        lines.append(f"    the global scope resolves {report['global_scope']}")
    return lines


def check_common(checks, run, baseline):
    who = f"{run['path']}, {label(run['shim'])}"
    sim, stats = run["sim"], run["stats"]
    checks(run["rc"] == 0, f"{who}: the workload exits 0", f"exit {run['rc']}; see {run['directory']}/output.txt")
    if run["shim"] is not None:
        checks(baseline is not None and run["result"] is not None and run["result"] == baseline["result"],
               f"{who}: output identical to the run without the shim")
        checks(stats is not None, f"{who}: the shim wrote its stats", f"in {run['directory']}")
        checks(not run["shim_lines"], f"{who}: the shim printed no warning", "; ".join(run["shim_lines"][:3]))
    checks(not sim["violations"], f"{who}: no violation in the runtime's log (registered memory stayed mapped and locked)",
           f"{sim['violations'][:3]}")
    checks(not sim["live_at_end"] and run["report"].get("fake_live_at_end") == 0
           and (stats is None or (stats["live"]["ranges"] == 0 and stats["unregister"]["exit"] == 0)),
           f"{who}: nothing registered at exit",
           f"log {len(sim['live_at_end'])}, runtime {run['report'].get('fake_live_at_end')}, "
           f"stats {stats and stats['live']}")
    released = [i for i in sim["instances"] if i["end"] is not None]
    bad = [i for i in released if i["live_after_release"]]
    checks(released and not bad and len(released) == len(sim["instances"]),
           f"{who}: every buffer's registrations undone before its release returned ({len(released)} releases)",
           f"{len(bad)} still registered; {len(sim['instances']) - len(released)} never released")
    checks(not sim["stray"], f"{who}: no registration call outside DeepSpeed's buffers", f"{sim['stray'][:3]}")


def check_aio(checks, run, baseline):
    who = f"aio, {label(run['shim'])}"
    sim, stats = run["sim"], run["stats"]
    instances = sim["instances"]
    if run["shim"] is None:
        checks(sim["register_ok"] == 0 and not sim["register_failed"],
               f"{who}: DeepSpeed registers none of its {len(instances)} locked tensors itself",
               f"{sim['register_ok']} registrations")
        return
    once = [i for i in instances if i["reg_ok"] == 1 and i["inexact"] == 0 and i["reg_failed"] == 0]
    checks(instances and len(once) == len(instances),
           f"{who}: every buffer registered exactly once, with its exact range ({len(once)} of {len(instances)})",
           f"counts {sorted({(i['reg_ok'], i['inexact'], i['reg_failed']) for i in instances})}")
    unreg = [i for i in instances if i["unreg_ok"] == i["reg_ok"] and i["unreg_failed"] == 0]
    checks(len(unreg) == len(instances), f"{who}: every registration unregistered once, before the release",
           f"{len(instances) - len(unreg)} not")
    if stats:
        checks(stats["register"]["ok"] == len(instances) == sim["register_ok"]
               and stats["program"]["registrations"] == 0 and stats["register"]["failed"] == 0
               and stats["unregister"]["failed"] == 0 and not stats["errors"],
               f"{who}: the shim's stats agree: {stats['register']['ok']} registered by the shim, "
               f"0 by the program, no failures",
               f"stats {stats['register']['ok']}/{stats['program']['registrations']}, log {sim['register_ok']}")


def check_native(checks, run, baseline):
    who = f"native, {label(run['shim'])}"
    sim, stats = run["sim"], run["stats"]
    instances = sim["instances"]
    result = run["result"] or ""
    pins = len(instances)
    checks(f"registered by DeepSpeed itself (register_host_memory returned True): {pins} of {pins}" in result,
           f"{who}: DeepSpeed's own registration succeeded for every buffer ({pins})")
    checks(REGISTRATION_WARNING not in result and "DeepSpeed warnings and errors: 0" in result,
           f"{who}: no warning from DeepSpeed")
    checks(" DeepSpeed calls: 0 not cudaSuccess" in result,
           f"{who}: cudaPeekAtLastError is cudaSuccess after every DeepSpeed call")
    checks(not sim["register_failed"] and not sim["unregister_failed"],
           f"{who}: no cudaHostRegister or cudaHostUnregister failed (no 712: never two owners at once)",
           f"register {sim['register_failed']}, unregister {sim['unregister_failed']}")
    if run["shim"] is None:
        registered = [i for i in instances if i["live_when_returned"]]
        checks(pins and len(registered) == pins,
               f"{who}: each buffer registered, with its exact range, when DeepSpeed's pin returned",
               f"{pins - len(registered)} not")
        once = [i for i in instances if i["reg_ok"] == 1 and i["unreg_ok"] == 1]
        checks(len(once) == pins and sim["register_ok"] == pins,
               f"{who}: DeepSpeed registers and unregisters each buffer exactly once ({sim['register_ok']})",
               f"{pins - len(once)} buffers otherwise")
        return
    # DeepSpeed's cudaHostRegister of a buffer the shim holds registered is
    # handed over: the registration is then the shim's, of the buffer's
    # whole pages.
    registered = [i for i in instances if i["live_when_returned"] or i["pages_when_returned"]]
    exact = sum(1 for i in instances if i["live_when_returned"])
    checks(pins and len(registered) == pins,
           f"{who}: each buffer registered when DeepSpeed's pin returned "
           f"({exact} with its exact range, {len(registered) - exact} its whole pages)",
           f"{pins - len(registered)} not")
    # Issue 17: sharing a buffer with DeepSpeed costs the runtime nothing:
    # it sees the calls it sees without the shim, one registration and one
    # unregistration per buffer (the shim hands its registration over).
    base_sim = (baseline or {}).get("sim") or {}
    checks(sim["register_ok"] == pins and sim["unregister_ok"] == pins
           and (not base_sim or (sim["register_ok"] == base_sim.get("register_ok")
                                 and sim["unregister_ok"] == base_sim.get("unregister_ok"))),
           f"{who}: the runtime sees as many calls as without the shim "
           f"({sim['register_ok']} cudaHostRegister, {sim['unregister_ok']} cudaHostUnregister "
           f"for {pins} buffers)",
           f"without the shim {base_sim.get('register_ok')} and {base_sim.get('unregister_ok')}")
    if stats:
        prog = stats["program"]
        checks(prog["registrations"] == pins and prog["unregistrations"] == pins,
               f"{who}: the shim saw DeepSpeed register each buffer exactly once "
               f"({prog['registrations']} registrations, {prog['unregistrations']} unregistrations)",
               f"{prog}")
        handed = prog.get("handed_over", 0)
        checks(sim["register_ok"] == stats["register"]["ok"] + prog["registrations"] - handed
               and stats["register"]["failed"] == 0 and stats["register"]["already_registered"] == 0
               and not stats["errors"],
               f"{who}: every registration in the runtime is the shim's or DeepSpeed's, those "
               f"handed over counted once ({stats['register']['ok']} + {prog['registrations']} - "
               f"{handed} = {sim['register_ok']})",
               f"stats {stats['register']}, errors {stats['errors']}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", required=True)
    parser.add_argument("--shim-command", required=True)
    parser.add_argument("--fake", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--torch-extensions")
    parser.add_argument("--aio-cycles", type=int, default=50)
    parser.add_argument("--native-cycles", type=int, default=10)
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--only", choices=["aio", "native"])
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    checks = Checks()
    started = time.perf_counter()
    runs = {}
    for path, shim in RUNS:
        if args.only and path != args.only:
            continue
        print(f"deepspeed: running {path}, {label(shim)} ...", flush=True)
        run = runs[(path, shim)] = run_one(args, path, shim)
        print(f"deepspeed:   exit {run['rc']} after {seconds(run['wall'])}", flush=True)

    for path in ("aio", "native"):
        path_runs = [runs[(p, s)] for p, s in RUNS if p == path and (p, s) in runs]
        if not path_runs:
            continue
        title = ("aio path: ZeRO-Infinity swap buffers (SwapBufferManager: aio_handle.new_cpu_locked_tensor "
                 "/ free_cpu_locked_tensor)" if path == "aio" else
                 "native path: DS_PIN_MEMORY_BACKEND=native, DeepSpeed registers through CUDA_Accelerator's hooks")
        print(f"\n== {title}, {path_runs[0]['cycles']} cycles")
        baseline = runs.get((path, None))
        if baseline and baseline["result"]:
            print("  the workload's output (the same in every run when the checks pass):")
            for line in baseline["result"].splitlines():
                print(f"  | {line}")
        for run in path_runs:
            print("\n".join(describe(run)))
        for run in path_runs:
            check_common(checks, run, baseline)
            (check_aio if path == "aio" else check_native)(checks, run, baseline)
            if run["shim"] is not None and run["result"] != (baseline or {}).get("result"):
                print(f"  output of {label(run['shim'])} differs from the run without the shim:")
                for line in (run["result"] or "(none)\n").splitlines():
                    print(f"  > {line}")
            if run["rc"] != 0:
                print(f"  the end of {run['directory']}/output.txt:\n{run['output_tail']}")

    print("\n== checks")
    print("\n".join(checks.lines))
    print(f"\ndeepspeed: all runs took {seconds(time.perf_counter() - started)}; logs in {args.workdir}")
    print(f"deepspeed: {checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
