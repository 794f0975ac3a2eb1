"""The one compiled part: twice.data's per-sample fetch loop (src/twice/_fetchloop.c).

Optional: where no C compiler is found the install goes on without it, and twice.data uses its
Python loop instead (the same samples, at a higher cost per sample). Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("twice._fetchloop", ["src/twice/_fetchloop.c"], optional=True)])
