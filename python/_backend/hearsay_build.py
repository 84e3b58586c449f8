"""PEP 517 backend of hearsay's pyproject.toml files: meson-python, run from the repository
root whichever directory pip was given (the root or python/), so that `pip install ./python`
builds the same wheel, with its own libhearsay.so, as `pip install .`.

meson-python builds in a temporary directory it removes; this wrapper also removes the native
file it leaves in the source root, so an install leaves the checkout as it found it."""
import contextlib
import os

import mesonpy

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def _at_root():
    here = os.getcwd()
    native = os.path.join(_ROOT, ".mesonpy-native-file.ini")
    existed = os.path.exists(native)
    os.chdir(_ROOT)
    try:
        yield
    finally:
        os.chdir(here)
        if not existed and os.path.exists(native):
            os.unlink(native)


def _abs(d):
    return os.path.abspath(d)


def get_requires_for_build_wheel(config_settings=None):
    with _at_root():
        return mesonpy.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _at_root():
        return mesonpy.get_requires_for_build_sdist(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel_directory = _abs(wheel_directory)
    with _at_root():
        return mesonpy.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    sdist_directory = _abs(sdist_directory)
    with _at_root():
        return mesonpy.build_sdist(sdist_directory, config_settings)
