"""The logical axis names that the modules give their parameters and activations (embed, mlp, heads, ...), and
the default rules mapping them onto the device mesh's axes: parallelism as data (`tupe.train.sharding` applies
them; the configs hold the rules explicitly, so config.json shows them).

The mesh has three axes: `data` (pure data parallelism), `fsdp` (data parallelism with parameters and optimizer
state sharded) and `tensor` (tensor parallelism over heads and the FFN width); the batch is split over (data, fsdp).
"""
import difflib

from tupe.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Rules as the command line gives them (`--config.sharding_rules="..."`): a Python literal, the names quoted.
COMMAND_LINE_EXAMPLE = "(('batch', ('data', 'fsdp')), ('embed', 'fsdp'), ('mlp', 'tensor'), ('heads', 'tensor'))"
DEFAULT_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("embedding", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("joined_kv", "fsdp"),           # ConvBERT's kernel generator input (heads x head_dim), like embed
    ("positions", None),
    ("buckets", None),
    ("conv_kernel", None),
    ("groups", None),
    ("layers", None),                # the leading axis of scanned layers' params (model.scan_layers)
    ("length", None),                # activations [batch, length, hidden] between layers: rows split as the
    ("activation_embed", None),      #   batch, hidden replicated (tupe.models.encoder.ACTIVATION_AXES)
)


def check_rule_names(rules_cfg) -> None:
  """A config's rules name only logical axes that the models have (`DEFAULT_RULES`'s): a typo matched nothing, and
  the axis it meant was replicated without a word (an FSDP mesh sharding no parameter). Made by the entry points'
  config checks, not by readers of a saved config.

  Raises:
    UserError: naming the unknown name, the closest known one and every known one.
  """
  known = [name for name, _ in DEFAULT_RULES]
  for name, axes in rules_from_config(rules_cfg):
    if name not in known:
      close = difflib.get_close_matches(name, known, n=1)
      raise UserError(f"sharding_rules names the logical axis {name!r}, which no parameter or activation has"
                      + (f" (did you mean {close[0]!r}?)" if close else "") + f"; they are {', '.join(known)}")
    if name == "batch" and axes != BATCH_AXES:  # (the input batch is split so: `tupe.train.sharding.batch_sharding`)
      raise UserError(f"sharding_rules maps 'batch' to {axes!r}, but the input batch is always split over "
                      f"{' and '.join(BATCH_AXES)} (its activations were resharded against it): give ('batch', "
                      f"{BATCH_AXES!r}), or leave the rule out")


def rules_from_config(rules_cfg) -> tuple:
  """Config rules are a list of [logical_name, mesh_axis | [mesh_axes] | None]; empty (configs written before
  the rules were explicit) means DEFAULT_RULES.

  Raises:
    UserError: for a rule that is not a pair or names a mesh axis other than data, fsdp and tensor.
  """
  if not rules_cfg:
    return DEFAULT_RULES
  rules = []
  for rule in rules_cfg:
    if not isinstance(rule, (list, tuple)) or len(rule) != 2 or not isinstance(rule[0], str):
      raise UserError(f"sharding_rules entry {rule!r} is not a pair [logical name, mesh axis | [mesh axes] | None]"
                      + ("; on the command line, give all the rules as a Python literal with quoted names, e.g. "
                         f"--config.sharding_rules=\"{COMMAND_LINE_EXAMPLE}\"" if isinstance(rule, str) else ""))
    name, axes = rule
    axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
    if not (axes is None or isinstance(axes, str) or isinstance(axes, tuple) and all(isinstance(a, str) for a in axes)):
      raise UserError(f"sharding_rules maps {name!r} to {rule[1]!r}: give a mesh axis, a list of mesh axes, or "
                      f"None")
    if isinstance(axes, tuple) and len(set(axes)) != len(axes):
      raise UserError(f"sharding_rules maps {name!r} to {rule[1]!r}, which names a mesh axis twice: name each once")
    unknown = [a for a in ((axes,) if isinstance(axes, str) else axes or ()) if a not in MESH_AXES]
    if unknown:
      raise UserError(f"sharding_rules maps {name!r} to mesh axis {unknown[0]!r}; the mesh axes are "
                      f"{', '.join(MESH_AXES)}")
    rules.append((name, axes))
  return tuple(rules)
