"""Loaded by schemathesis (`SCHEMATHESIS_HOOKS`) when `tests/api/schemathesis.rs` runs it.

On the CPython these machines have (3.11.7), `ast.parse` of a large module called deep in a
stack can fail with "SystemError: AST constructor recursion depth mismatch", an interpreter
bug. Hypothesis parses source files only to describe the lambdas of filtered strategies in
their reprs, and schemathesis's coverage phase hit that now and then as a "Runtime Error" of a
random operation. The descriptions are cosmetic, so a plain one is used instead; generation
and checks are unchanged.
"""

from hypothesis.internal import lambda_sources


def _plain_description(f):
    return "lambda"


lambda_sources.lambda_description = _plain_description
