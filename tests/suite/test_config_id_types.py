"""A float knob written as 1 (a YAML int) or 1.0 is one configuration: the suite's config id and
the one the trainer computes from its parsed command line must agree (they did not: 1 and 1.0
hashed apart, so a repeat's record looked like another configuration's)."""
from shardbench.suite.matrix.expand import expand, matrix_from_dict
from shardbench.trainer.config import build_parser, id_fields
from shardbench.trainer import contract

BASE = {"strategies": ["ddp"], "world_sizes": [1], "seq_lens": [64], "repeats": 1, "model": "tiny"}


def only_spec(**knobs):
    specs, errors = expand(matrix_from_dict({**BASE, **knobs}))
    assert not errors and len(specs) == 1, errors
    return specs[0]


def test_int_and_float_of_a_float_knob_are_one_configuration():
    as_int, as_float = only_spec(grad_clip=1, bucket_mib=25), only_spec(grad_clip=1.0, bucket_mib=25.0)
    assert as_int.config_id == as_float.config_id


def test_the_trainer_computes_the_suite_s_config_id_from_the_command_line():
    spec = only_spec(grad_clip=2, bucket_mib=50)
    parsed = build_parser().parse_args(spec.trainer_args())
    cfg = type(spec.config)(**{k: v for k, v in vars(parsed).items() if k in spec.config.__dataclass_fields__})
    measured = id_fields(cfg, spec.world_size, spec.nodes, spec.launcher)
    assert contract.config_id(measured) == spec.config_id
