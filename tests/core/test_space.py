import pytest

from autogen.errors import InvalidConfigError
from autogen.core.space import Param, Space

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


# A parameter added to a family after its winners were stored: `late` did not exist before.
GROWN = Space(params=SPACE.params + (Param("late", ("old", "new"), "l", added_with_default="old"),),
              constraints=SPACE.constraints)


def test_a_point_stored_before_a_parameter_was_added_takes_its_old_behaviour():
    stored = {"width": 4, "mode": "b"}
    assert GROWN.complete(stored) == {"width": 4, "mode": "b", "late": "old"}
    assert GROWN.check(stored).params == (("width", 4), ("mode", "b"), ("late", "old"))
    assert GROWN.violations(stored) == []
    assert GROWN.stored_point(stored) == {"width": 4, "mode": "b", "late": "old"}
    # Only added parameters are filled: a family's own parameters stay required.
    assert GROWN.violations({"width": 4}) == ["missing parameter mode"]


@pytest.mark.parametrize("stored", [["width", 4], {"width": 4}, {"width": 3, "mode": "a"},
                                    {"width": 4, "mode": "a", "gone": 1}])
def test_a_stored_point_that_no_longer_fits_is_none(stored):
    assert GROWN.stored_point(stored) is None


def test_an_added_parameter_is_named_only_away_from_its_old_behaviour():
    late = GROWN.param("late")
    assert not late.named_in_kernel("old") and late.named_in_kernel("new")
    assert SPACE.param("mode").named_in_kernel("a")  # parameters a family was born with: always named


def test_the_old_behaviour_must_be_one_of_the_choices():
    with pytest.raises(ValueError, match="added_with_default='older' is not one of"):
        Param("late", ("old", "new"), "l", added_with_default="older")
