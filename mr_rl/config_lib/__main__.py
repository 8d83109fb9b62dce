"""CLI: `python -m mr_rl.config_lib list|show|estimate|smoke configs/<file>.py[:arg]`.

    list      every sweep point of a config file (or the subset matching arg) as a command
    show      the resolved config of one point
    estimate  v5p (or --chip) chip-hours per sweep point and in total
    smoke     one `runlocal` step of each given point through the real trainer, in one process
              (compiled functions are shared); --json writes per-point status, time, work dir
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Sequence

from mr_rl.config_lib.args import load_config_module
from mr_rl.config_lib.estimates import CHIPS, estimate_config
from mr_rl.config_lib.local import blocker
from mr_rl.config_lib.paper import MODELS_BY_HUB

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _split(target: str) -> tuple[str, str | None]:
  path, sep, arg = target.partition(":")
  return path, (arg if sep else None)


def smoke(targets: Sequence[str], workdir_root: str) -> dict[str, dict]:
  """Runs the `runlocal` version of each target (one step; 'tag': one probe step per channel)."""
  from mr_rl import pipelines  # pylint: disable=import-outside-toplevel
  results = {}
  for target in targets:
    path, arg = _split(target)
    c = load_config_module(path).get_config(",".join(filter(None, [arg, "runlocal"])))
    why = blocker(c)
    if why:
      results[target] = {"status": "blocked", "reason": why}
      continue
    name = os.path.splitext(os.path.basename(path))[0] + "-" + (arg or "default").replace(
        ",", "-").replace("=", "_")
    workdir = os.path.join(workdir_root, name)
    t0 = time.time()
    try:
      pipelines.run(c, workdir)
      res = {"status": "ok"}
    except Exception as e:  # pylint: disable=broad-except  # reported per target
      res = {"status": "error", "error": f"{type(e).__name__}: {e}",
             "traceback": traceback.format_exc()}
    res.update(seconds=round(time.time() - t0, 2), workdir=workdir)
    results[target] = res
    print(f"[smoke] {target}: {res['status']} in {res['seconds']} s", file=sys.stderr, flush=True)
  return results


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(prog="python -m mr_rl.config_lib", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("command", choices=("list", "show", "estimate", "smoke"))
  p.add_argument("target", nargs="+", help="configs/<file>.py[:key=value,...] (smoke: several)")
  p.add_argument("--chip", default="v5p", choices=sorted(CHIPS))
  p.add_argument("--workdir_root", default="$WORKDIR_ROOT",
                 help="prefix of the work directories printed by `list` / used by `smoke`")
  p.add_argument("--json", default="", help="smoke: write the per-target results here")
  a = p.parse_args(argv)
  if a.command == "smoke":
    root = a.workdir_root if a.workdir_root != "$WORKDIR_ROOT" else "/tmp/mr_rl_smoke"
    results = smoke(a.target, root)
    if a.json:
      with open(a.json, "w") as f:
        json.dump(results, f, indent=1)
    bad = [t for t, r in results.items() if r["status"] == "error"]
    for t in bad:
      print(f"[smoke] {t} failed:\n{results[t]['traceback']}", file=sys.stderr)
    sys.exit(1 if bad else 0)
  if len(a.target) != 1:
    p.error(f"{a.command} takes one target")
  path, arg = _split(a.target[0])
  module = load_config_module(path)
  rel = os.path.relpath(os.path.abspath(path), REPO) if os.path.abspath(path).startswith(REPO) else path
  if a.command == "show":
    print(module.get_config(arg))
    return
  total = 0.0
  for point in module.sweep(arg):
    c = module.get_config(point)
    why = blocker(c)
    if a.command == "list":
      wd = f"{a.workdir_root}/{os.path.splitext(os.path.basename(path))[0]}/" + \
           point.replace(",", "/").replace("=", "-")
      line = f"python -m mr_rl.main --config={rel}:{point} --workdir={wd}"
      print(line + (f"   # NOT RUNNABLE YET: {why}" if why else ""))
    else:
      h = estimate_config(c, a.chip)
      total += h
      print(f"{rel}:{point}\t{h:9.1f} {a.chip} chip-hours"
            f"\t{MODELS_BY_HUB.get(c.model.path, '?')}" + (f"\t# {why}" if why else ""))
  if a.command == "estimate":
    print(f"total\t{total:9.1f} {a.chip} chip-hours")


if __name__ == "__main__":
  main(sys.argv[1:])
