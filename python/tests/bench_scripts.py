"""Loads a script of bench/ as a module for the tests of it (the scripts are not a package)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_path(name):
    return os.path.join(ROOT, "bench", name + ".py")


def load(name):
    spec = importlib.util.spec_from_file_location(name, script_path(name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
