"""The shape of a JSON document: its keys and value types, merged over every value seen at one place (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Shape:
    """The keys and value types seen at one place of a JSON document, merged over every value seen there."""

    types: set = field(default_factory=set)
    keys: dict = field(default_factory=dict)
    items: Shape | None = None

    def add(self, value, path: str = "") -> Shape:
        if value is None:
            self.types.add("null")
        elif isinstance(value, bool):
            self.types.add("bool")
        elif isinstance(value, int):
            self.types.add("int")
        elif isinstance(value, float):
            self.types.add("float")
        elif isinstance(value, str):
            self.types.add("str")
        elif isinstance(value, list):
            self.types.add("array")
            for item in value:
                self.items = (self.items or Shape()).add(item, f"{path}[]")
        elif isinstance(value, dict):
            if path.endswith("logprobs.top_logprobs[]") and all(isinstance(v, float) for v in value.values()):
                # A completion's top logprobs map tokens to values: the keys are generated text.
                self.types.add("map")
                for item in value.values():
                    self.items = (self.items or Shape()).add(item, f"{path}{{}}")
            else:
                self.types.add("object")
                for key, item in value.items():
                    self.keys[key] = self.keys.get(key, Shape()).add(item, f"{path}.{key}")
        return self


def shape_of(*values, path: str = "") -> Shape:
    shape = Shape()
    for value in values:
        shape.add(value, path)
    return shape


def shape_diff(engine: Shape, sim: Shape, path: str = "$") -> list[str]:
    out = []
    if engine.types != sim.types:
        out.append(f"{path}: engine {sorted(engine.types)}, simulator {sorted(sim.types)}")
    for key in sorted(set(engine.keys) - set(sim.keys)):
        out.append(f"{path}.{key}: missing in the simulator")
    for key in sorted(set(sim.keys) - set(engine.keys)):
        out.append(f"{path}.{key}: only in the simulator")
    for key in sorted(set(engine.keys) & set(sim.keys)):
        out += shape_diff(engine.keys[key], sim.keys[key], f"{path}.{key}")
    if engine.items is not None and sim.items is not None:  # an empty list fits any items
        out += shape_diff(engine.items, sim.items, f"{path}[]")
    return out
