"""Parallelism as data, applied: a device mesh from the config, and shardings from logical-axis rules.

Model parameters carry logical axis names (embed, mlp, heads, ...); rules (`tupe.models.partitioning`, held in
every config) map them to the mesh's axes (data, fsdp, tensor), so changing the parallelism is a config change,
never a model edit. The encoder constrains its [batch, length, hidden] activations between layers by the same
rules (`activation_context`). A mesh axis that does not divide the dimension it is given is dropped from it with a
warning (`_fit`). The batch is split over (data, fsdp), evenly (`check_batch_size`).
"""
from __future__ import annotations

import contextlib
import math

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from tupe import console
from tupe.errors import UserError
from tupe.models import partitioning


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
  """Resolves the mesh shape; one axis may be -1 (= the devices left over)."""
  sizes = [int(mesh_cfg[a]) for a in partitioning.MESH_AXES]
  desc = " x ".join(f"{a}={s}" for a, s in zip(partitioning.MESH_AXES, sizes))
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise UserError(f"mesh {desc}: use positive sizes with at most one -1 (= the remaining devices)")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise UserError(f"mesh {desc} does not fit {num_devices} devices: {known} does not divide "
                      f"{num_devices}; change --config.mesh.*")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise UserError(f"mesh {desc} has {math.prod(sizes)} devices but {num_devices} are available; "
                    f"make the product equal (or set one axis to -1)")
  return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  """The mesh of the config's shape, laid out on the devices' topology by JAX's `create_device_mesh` (neighbouring
  chips on the innermost axes). Where it cannot lay a shape out: on accelerators one line (a mesh in plain device
  order would run, slower, and nothing would say so); on CPU devices, which have no topology to respect, the plain
  order, with one warning."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_cfg, len(devices))
  try:
    arr = mesh_utils.create_device_mesh(shape, devices=devices)
  except Exception as e:
    platform = devices[0].platform
    where = (f"mesh {dict(zip(partitioning.MESH_AXES, shape))} cannot be laid out on the topology of these "
             f"{len(devices)} {platform} devices ({type(e).__name__}: {e})")
    if platform != "cpu":
      raise UserError(f"{where}; choose mesh sizes that fit it (--config.mesh.*)") from e
    console.warn(f"{where}: using them in plain device order")
    arr = np.asarray(devices).reshape(shape)
  return Mesh(arr, partitioning.MESH_AXES)


def _fit(spec: P, shape, mesh: Mesh, misfits: list | None = None, where: str = "") -> P:
  """Drops mesh axes from dimensions they do not divide (those dimensions are replicated instead), noting
  each in `misfits` as (where, dimension index, shape, mesh axes, their size)."""
  fitted = []
  for i, (dim, axes) in enumerate(zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[n] for n in names)
    fits = dim % size == 0
    fitted.append(axes if fits else None)
    if not fits and misfits is not None:
      misfits.append((where, i, tuple(shape), names, size))
  return P(*fitted)


def _warn_misfits(misfits: list) -> None:
  """One warning line per mesh axes and dimension size that did not fit, naming the first parameter; once per
  process (a GLUE grid lays out its encoder once, then once more inside each task's model, `encoder/...`)."""
  groups = {}
  for where, i, shape, names, size in misfits:
    groups.setdefault((names, size, shape[i]), []).append((where, i, shape))
  for (names, size, dim), found in groups.items():
    where, i, shape = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    console.warn_once(f"mesh axis {'x'.join(names)} of size {size} does not divide dimension {i} (size {dim}) of "
                      f"{where} {list(shape)}{more}; that dimension is replicated instead: change --config.mesh.* or "
                      f"--config.sharding_rules", key=("mesh misfit", names, size, dim, where.removeprefix("encoder/")))


def logical_shardings(abstract_tree, mesh: Mesh, rules):
  """NamedShardings for a tree whose leaves may be `nn.LogicallyPartitioned` boxes (others replicate).

  A mesh axis that does not divide the dimension its rule gives it is dropped from that dimension, with a
  one-line warning naming the parameter, the dimension and the mesh axis.
  """
  specs = nn.get_partition_spec(abstract_tree)
  mesh_specs = nn.logical_to_mesh(specs, rules)
  shapes = nn.meta.unbox(abstract_tree)
  misfits = []
  name = lambda path: jax.tree_util.keystr(path, simple=True, separator="/")
  shardings = jax.tree_util.tree_map_with_path(
      lambda path, spec, x: NamedSharding(mesh, _fit(spec, x.shape, mesh, misfits, name(path))),
      mesh_specs, shapes, is_leaf=lambda s: isinstance(s, P))
  _warn_misfits(misfits)
  return shardings


@contextlib.contextmanager
def activation_context(mesh: Mesh, rules):
  """While tracing a step: the mesh and logical-axis rules that the model's activation constraints
  (`nn.with_logical_constraint`) resolve against. Without it they do nothing."""
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
    yield


def under_rules(fn, mesh: Mesh, rules):
  """fn run inside `activation_context(mesh, rules)`: wrap a step with it before jitting it."""
  def wrapped(*args, **kwargs):
    with activation_context(mesh, rules):
      return fn(*args, **kwargs)
  return wrapped


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over (data, fsdp); the rest replicated."""
  return NamedSharding(mesh, P(partitioning.BATCH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in partitioning.BATCH_AXES)


def check_batch_size(name: str, size: int, mesh: Mesh, accum: int = 1) -> None:
  """The one batch-size rule: a batch of `size` rows splits evenly over the data-parallel devices (and so over the
  hosts' row blocks, `host_rows`) and over `accum` gradient-accumulation microbatches.

  Raises:
    UserError: naming the field (`name`) and the multiple to pick.
  """
  dp = data_parallel_size(mesh)
  if size % (dp * accum):
    over = f"data-parallel size {dp}" + (f" x grad_accum_steps {accum}" if accum > 1 else "")
    raise UserError(f"{name}={size} is not divisible by {over}; pick a multiple of {dp * accum}")


def host_rows(mesh: Mesh, global_batch_size: int) -> tuple[int, int]:
  """The rows [start, stop) of a global batch that this host's devices hold under `batch_sharding`.

  Hosts whose devices differ only along model axes (a tensor axis across hosts) hold the same rows.

  Raises:
    UserError: when this host's rows are not one contiguous block (a mesh whose device order interleaves
      hosts along the batch axes).
  """
  indices = batch_sharding(mesh).addressable_devices_indices_map((global_batch_size,)).values()
  blocks = sorted({index[0].indices(global_batch_size)[:2] for index in indices})
  start, stop = blocks[0][0], blocks[-1][1]
  if sum(b - a for a, b in blocks) != stop - start:
    raise UserError(f"host {jax.process_index()} holds rows {blocks} of each batch, not one block; order the "
                    f"mesh's devices host by host along its data and fsdp axes")
  return start, stop


def shard_batch(batch: dict, mesh: Mesh) -> dict:
  """A whole global batch, the same numpy arrays on every host -> global jax.Arrays (each host sends its rows)."""
  size = len(next(iter(batch.values())))
  start, stop = host_rows(mesh, size)
  return global_batch({k: v[start:stop] for k, v in batch.items()}, mesh, size)


def global_batch(local_batch: dict, mesh: Mesh, global_batch_size: int) -> dict:
  """This host's rows (numpy, `host_rows`) of a batch -> global jax.Arrays sharded over (data, fsdp)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v), (global_batch_size,) + v.shape[1:])
          for k, v in local_batch.items()}
