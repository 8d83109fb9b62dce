"""CLI: ``python -m mr_rl.theory --out DIR`` draws the section-9 figures.

Writes ``phase_G<G>.png`` and ``phase_Ginf.png`` (drift sign over the (rho, eta)
grid for additive, 0.9/0.1 weighted, min, TAG, AMRP and GDPO, at the finite group
size G and for G -> inf) and ``trajectories.png`` (log-odds from several starting
points, finite G solid and G -> inf dashed), and prints the paths.  Runs in well
under a minute on CPU (about 15 s of CPU time with the defaults).
"""

from __future__ import annotations

import argparse
import sys
import time

from mr_rl.theory import plots


def _parse(argv):
  d = plots.FigureConfig()
  ap = argparse.ArgumentParser(prog="python -m mr_rl.theory", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True, help="output directory for the PNG files")
  ap.add_argument("--grid", type=int, default=d.grid, help="grid points per axis")
  ap.add_argument("--group-size", type=int, default=d.group_size, help="finite G")
  ap.add_argument("--theta", type=float, default=d.theta, help="log-odds of the phase plots")
  ap.add_argument("--lam", type=float, default=d.lam, help="TAG lambda")
  ap.add_argument("--lr", type=float, default=d.lr, help="trajectory step size")
  ap.add_argument("--steps", type=int, default=d.steps, help="trajectory length")
  ap.add_argument("--amrp-steps", type=int, default=d.amrp_steps,
                  help="AMRP steps for its phase diagram")
  ap.add_argument("--traj-rho", type=float, default=d.traj_rho, help="rho of trajectories")
  ap.add_argument("--traj-eta", type=float, default=d.traj_eta, help="eta of trajectories")
  ap.add_argument("--theta0s", type=float, nargs="+", default=list(d.theta0s),
                  help="starting log-odds of the trajectories")
  return ap.parse_args(argv)


def main(argv=None) -> list[str]:
  """Parses ``argv`` (default ``sys.argv[1:]``), writes the figures, returns the paths."""
  args = _parse(sys.argv[1:] if argv is None else argv)
  cfg = plots.FigureConfig(grid=args.grid, group_size=args.group_size, theta=args.theta,
                           lam=args.lam, lr=args.lr, steps=args.steps,
                           amrp_steps=args.amrp_steps, traj_rho=args.traj_rho,
                           traj_eta=args.traj_eta, theta0s=tuple(args.theta0s))
  start = time.time()
  data = plots.compute_figures_data(cfg)
  paths = plots.write_figures(data, cfg, args.out)
  for p in paths:
    print(p)
  print(f"# {len(paths)} figures in {time.time() - start:.1f} s", file=sys.stderr)
  return paths


if __name__ == "__main__":
  main()
