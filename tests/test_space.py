import pytest

from autogen.errors import InvalidConfigError
from autogen.space import Param, Space

SPACE = Space(
    params=(Param("width", (1, 2, 4), "w"), Param("mode", ("a", "b"), "m")),
    constraints=(lambda p: "b needs width 4" if p["mode"] == "b" and p["width"] != 4 else None,),
)


def test_enumerate_keeps_only_valid_points_in_order():
    points = [c.as_dict() for c in SPACE.enumerate()]
    assert points == [{"width": 1, "mode": "a"}, {"width": 2, "mode": "a"},
                      {"width": 4, "mode": "a"}, {"width": 4, "mode": "b"}]
    assert SPACE.size() == 4


@pytest.mark.parametrize("params, fragment", [
    ({"width": 3, "mode": "a"}, "width=3 is not one of"),
    ({"width": True, "mode": "a"}, "width=True"),  # bool must not pass for an int
    ({"width": "4", "mode": "a"}, "width='4'"),  # nor a string for an int: it would reach a template
    ({"width": 4}, "missing parameter mode"),
    ({"width": 4, "mode": "a", "evil": "*/ system(); /*"}, "unknown parameter(s) evil"),
    ({"width": 2, "mode": "b"}, "b needs width 4"),
])
def test_check_rejects_with_a_reason(params, fragment):
    with pytest.raises(InvalidConfigError) as info:
        SPACE.check(params)
    assert fragment in str(info.value)


def test_check_returns_config_in_space_order():
    config = SPACE.check({"mode": "b", "width": 4})
    assert config.params == (("width", 4), ("mode", "b"))
    assert config["mode"] == "b"
