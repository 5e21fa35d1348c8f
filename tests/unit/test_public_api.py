from __future__ import annotations

from types import ModuleType

import agentrooms
from agentrooms import errors


def test_all_is_exactly_the_public_surface() -> None:
    public = {name for name in vars(agentrooms) if not name.startswith("_")}
    modules = {n for n, v in vars(agentrooms).items() if isinstance(v, ModuleType)}
    assert set(agentrooms.__all__) - {"__version__"} == public - modules
    assert sorted(agentrooms.__all__) == agentrooms.__all__


def test_every_error_is_exported_and_has_a_distinct_code() -> None:
    kinds = [getattr(errors, name) for name in errors.__all__]
    assert set(errors.__all__) <= set(agentrooms.__all__)
    codes = [k.code for k in kinds]
    assert len(set(codes)) == len(codes)
