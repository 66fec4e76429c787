"""What the launch commands (render, ray_train) share of their command lines: their own flags, then training's
overrides after `--`."""
import argparse


def flags_and_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """The command's own arguments, and training's overrides: those after the first `--`."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1, or argparse's one line naming the value."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)
