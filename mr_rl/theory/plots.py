"""Figures of the conditional-mean GRPO dynamics (docs/methods.md §9).

``compute_figures_data`` evaluates (in one jitted computation), for every method in ``METHOD_NAMES``, the drift
sign over a ``(rho, eta)`` grid (finite G and G -> inf) and log-odds trajectories from
several starting points; ``write_figures`` draws them with matplotlib (Agg backend).
For the stateful AMRP (its weights need a history) the "drift sign" is the sign of
``mean(theta_t, t in (T/2, T]) - theta_0`` over ``T = amrp_steps`` steps from
``theta_0 = theta``: where AMRP settles into an oscillation around a mixed policy the
second-half mean is steadier than the last iterate.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.theory import drift as drift_lib
from mr_rl.theory import dynamics

Array = jax.Array

TITLES = {"additive": "additive (r1+r2)/2", "weighted_0.9_0.1": "weighted 0.9 r1 + 0.1 r2",
          "min": "AND: min(r1, r2)", "tag": "TAG (anchor r1)", "amrp": "AMRP (GRPO)",
          "gdpo": "GDPO (w = 1)"}
SIGN_TOL = 1e-7  # |drift| below this is drawn as "no drift".


@dataclasses.dataclass(frozen=True)
class FigureConfig:
  """Settings of the CLI figures.

  Attributes:
    grid: number of rho and of eta values (rho, eta in (0, 1), cell centres).
    group_size: finite G of the left panels (the right panels use G -> inf).
    theta: log-odds at which the phase-diagram drift is evaluated.
    lam: TAG gate lambda.
    lr: step size of the trajectories.
    steps: trajectory length T.
    amrp_steps: AMRP steps used for its phase diagram.
    traj_rho: primary success rate of the trajectory panels.
    traj_eta: auxiliary success rate of the trajectory panels.
    theta0s: starting log-odds of the trajectories.
  """
  grid: int = 41
  group_size: int = 8
  theta: float = 0.0
  lam: float = 1.0
  lr: float = 1.0
  steps: int = 300
  amrp_steps: int = 100
  traj_rho: float = 0.05
  traj_eta: float = 0.3
  theta0s: tuple[float, ...] = (-4.0, -2.0, 0.0, 2.0, 4.0)

  def __post_init__(self):
    if self.grid < 2:
      raise ValueError(f"grid must be >= 2, got {self.grid}")
    if self.group_size < 2:
      raise ValueError(f"group_size must be >= 2, got {self.group_size}")
    for name in ("steps", "amrp_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if not self.lr > 0:
      raise ValueError(f"lr must be > 0, got {self.lr}")
    if self.lam < 0:
      raise ValueError(f"lam must be >= 0, got {self.lam}")
    for name in ("traj_rho", "traj_eta"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
    if not self.theta0s:
      raise ValueError("theta0s must not be empty")


def grid_values(n: int) -> np.ndarray:
  """Cell centres ``(i + 0.5) / n`` in (0, 1)."""
  return (np.arange(n) + 0.5) / n


SCALAR_METHODS = ("additive", "weighted_0.9_0.1", "min", "tag")


def _all_arrays(cfg: FigureConfig) -> dict[str, tuple[Array, ...]]:
  """Phase values (G, inf) and trajectories (G, inf) of every method (traceable).

  The scalar-reward methods share one drift evaluation, vmapped over their reward
  tables ``R_table`` (one row of ``Y`` outcomes per method; ``drift.table_aggregator``),
  which keeps the compile small.
  """
  rho_grid = jnp.asarray(grid_values(cfg.grid), jnp.float32)
  theta0s = jnp.asarray(cfg.theta0s, jnp.float32)
  R_table = jnp.stack([drift_lib.aggregate_rewards(dynamics.aggregator_for(n, lam=cfg.lam))
                    for n in SCALAR_METHODS])

  def scalar_drift(group_size):
    def fn(R_Y, theta, r, e):
      return drift_lib.expected_drift(theta, rho=r, eta=e, group_size=group_size,
                                      aggregator=drift_lib.table_aggregator(R_Y))
    return fn

  def gdpo_drift(group_size):
    return lambda theta, r, e: drift_lib.expected_drift_gdpo(theta, rho=r, eta=e,
                                                             group_size=group_size)

  def amrp_phase(group_size):
    def fn(r, e):
      theta_traj = dynamics.amrp_trajectory(cfg.theta, rho=r, eta=e, lr=cfg.lr,
                                            num_steps=cfg.amrp_steps, group_size=group_size)[0]
      return jnp.mean(theta_traj[cfg.amrp_steps // 2 + 1:]) - cfg.theta
    return dynamics.phase_diagram(fn, rho_grid, rho_grid)

  def traj(drift_fn):
    one = lambda t0: dynamics.integrate(  # pylint: disable=g-long-lambda
        lambda th: drift_fn(th, cfg.traj_rho, cfg.traj_eta), t0, lr=cfg.lr,
        num_steps=cfg.steps)
    return jax.vmap(one)(theta0s)

  def amrp_traj(group_size):
    one = lambda t0: dynamics.amrp_trajectory(  # pylint: disable=g-long-lambda
        t0, rho=cfg.traj_rho, eta=cfg.traj_eta, lr=cfg.lr, num_steps=cfg.steps,
        group_size=group_size)[0]
    return jax.vmap(one)(theta0s)

  out = {}
  per_g = []
  for g in (cfg.group_size, None):
    fn = scalar_drift(g)
    phase_by_method = jax.vmap(lambda R_Y, fn=fn: dynamics.phase_diagram(
        lambda r, e: fn(R_Y, cfg.theta, r, e), rho_grid, rho_grid))(R_table)
    traj_by_method = jax.vmap(lambda R_Y, fn=fn: traj(
        lambda th, r, e: fn(R_Y, th, r, e)))(R_table)
    gd = gdpo_drift(g)
    per_g.append(dict(
        scalar=(phase_by_method, traj_by_method),
        gdpo=(dynamics.phase_diagram(lambda r, e, gd=gd: gd(cfg.theta, r, e), rho_grid,
                                      rho_grid),
              traj(gd)),
        amrp=(amrp_phase(g), amrp_traj(g))))
  fin, inf = per_g
  for m, name in enumerate(SCALAR_METHODS):
    out[name] = (fin["scalar"][0][m], inf["scalar"][0][m], fin["scalar"][1][m],
                 inf["scalar"][1][m])
  for name in ("amrp", "gdpo"):
    out[name] = (fin[name][0], inf[name][0], fin[name][1], inf[name][1])
  return out


def compute_figures_data(cfg: FigureConfig) -> dict[str, tuple[np.ndarray, ...]]:
  """``{method: (phase_G, phase_inf, traj_G, traj_inf)}``: phases of shape
  ``(grid, grid)`` (rows eta, columns rho), trajectories ``(len(theta0s), steps + 1)``.

  Everything is one jitted computation.
  """
  arrays = jax.jit(lambda: _all_arrays(cfg))()
  return {name: tuple(np.asarray(x) for x in arrays[name]) for name in dynamics.METHOD_NAMES}


def _sign(x: np.ndarray) -> np.ndarray:
  return np.where(np.abs(x) <= SIGN_TOL, 0.0, np.sign(x))


def _draw_phase(ax, values, title):
  from matplotlib.colors import ListedColormap  # pylint: disable=g-import-not-at-top
  cmap = ListedColormap(["#d62728", "#dddddd", "#1f77b4"])  # S, none, P.
  ax.imshow(_sign(values), origin="lower", extent=(0, 1, 0, 1), cmap=cmap, vmin=-1, vmax=1,
            interpolation="nearest", aspect="equal")
  ax.plot([0, 1], [1, 0], "k--", lw=0.8)
  ax.set_title(title, fontsize=8)
  ax.set_xlabel("rho (primary success of P)", fontsize=7)
  ax.set_ylabel("eta (auxiliary success of P)", fontsize=7)
  ax.tick_params(labelsize=6)


def write_figures(data, cfg: FigureConfig, out_dir: str) -> list[str]:
  """Draws ``phase_G<G>.png``, ``phase_Ginf.png`` and ``trajectories.png``; returns paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  os.makedirs(out_dir, exist_ok=True)
  paths = []
  n = len(dynamics.METHOD_NAMES)
  cols = 3
  rows = -(-n // cols)
  for i, (sub, tag) in enumerate(((f"G = {cfg.group_size}", f"G{cfg.group_size}"),
                                  ("G -> inf", "Ginf"))):
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, dynamics.METHOD_NAMES):
      what = (f"sign(mean late theta - theta_0), T = {cfg.amrp_steps}" if name == "amrp" else
              "sign(drift)")
      _draw_phase(ax, data[name][i], f"{TITLES[name]}\n{what}")
    for ax in list(axes.flat)[n:]:
      ax.axis("off")
    fig.suptitle(f"{sub}, theta = {cfg.theta:g}: blue drifts toward P, red toward the "
                 "shortcut S, grey none; dashed rho + eta = 1", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, f"phase_{tag}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)

  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
  steps = np.arange(cfg.steps + 1)
  for ax, name in zip(axes.flat, dynamics.METHOD_NAMES):
    traj_g, traj_inf = data[name][2], data[name][3]
    for s, theta0 in enumerate(cfg.theta0s):
      line, = ax.plot(steps, traj_g[s], lw=1.2, label=f"theta0 = {theta0:g}")
      ax.plot(steps, traj_inf[s], lw=0.8, ls="--", color=line.get_color())
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_title(f"{TITLES[name]} (solid G = {cfg.group_size}, dashed G -> inf)", fontsize=8)
    ax.set_xlabel("step", fontsize=7)
    ax.set_ylabel("log-odds theta of P", fontsize=7)
    ax.tick_params(labelsize=6)
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=6)
  fig.suptitle(f"log-odds trajectories, rho = {cfg.traj_rho:g}, eta = {cfg.traj_eta:g}, "
               f"lr = {cfg.lr:g}", fontsize=9)
  fig.tight_layout()
  path = os.path.join(out_dir, "trajectories.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  paths.append(path)
  return paths
