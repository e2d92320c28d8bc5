"""The verdict dict shared by the launcher (which writes it) and the command (which prints it).

Keys: verdict ("equivalent" | "diverged" | "not_converted": the candidate never ran a forward through its
multi-GPU wrapper | "error"), diverged_at, message (the verdict
line), mode ("exact" | "statistical" | None), steps (per-step rows), tolerances (the bound
each per-step column was held to, once the runs were compared), notes, preconditions, and for a
pair that hung, hangs (per hung process: its summary line, its stack's frames, the converter's change).
Imports the standard library only.
"""

from __future__ import annotations

from ddpify.exit_codes import EXIT_ERROR, EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK

_EXIT_CODES = {"equivalent": EXIT_OK, "diverged": EXIT_FOUND, "error": EXIT_ERROR, "not_converted": EXIT_INCOMPLETE}


def error_result(message: str) -> dict:
    """A verdict for a pair that could not be run or compared."""
    return {"verdict": "error", "diverged_at": None, "message": f"could not run: {message}",
            "mode": None, "steps": [], "notes": [], "preconditions": []}


def exit_code(result: dict) -> int:
    return _EXIT_CODES[result["verdict"]]
