"""Checks shared by the typed configs: each raises ValueError naming the field, which params parsing turns
into one line naming the key in params.yaml."""


def require_positive(config, *names: str) -> None:
    """Raises ValueError naming the first of `names` whose value on `config` is not > 0."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def require_one_of(config, name: str, choices: tuple[str, ...]) -> None:
    """Raises ValueError naming `name` and its choices where its value on `config` is not one of them."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{name} '{value}' is unknown; use one of {', '.join(choices)}")


def require_layer_sizes(hidden_layers: list[int]) -> None:
    if not hidden_layers or min(hidden_layers) <= 0:
        raise ValueError(f"hidden_layers must be positive sizes, got {hidden_layers}")


def require_conv_filters(conv_filters: list[list[int]]) -> None:
    if not conv_filters or any(len(layer) != 3 or min(layer) <= 0 for layer in conv_filters):
        raise ValueError(f"conv_filters must be [channels, kernel, stride] layers of positive sizes, got {conv_filters}")
