"""Rule changes: through the versioned rule store (delta-rs) in this process, with the
``velocity_default`` connection's settings, the same validation and the same words as
`velocity rules`; applied in well under a second, the stream takes them up on its next
micro-batch. Only a file that clears the state (CLEAR_STATE_ALL) runs `velocity rules
apply`, since deleting every bucket takes Spark. And the rules in force, as JSON."""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from velocity_airflow.page import access, common, home
from velocity_airflow.page.common import URL_PREFIX
from velocity_airflow.page.home_html import Flash, PageData, rule_row

# One state clearing at a time: each starts a Spark session in the api-server's process
# tree. (Rule changes need no lock: the rule store serialises concurrent appliers.)
_CLEAR_STATE = threading.Lock()

# The actions whose change the page draws in place (the rule's row): a promotion or a
# discard changes the shadow table and the precision too, and the page is drawn anew.
IN_PLACE_ACTIONS = ("pause", "activate", "delete")

router = APIRouter()
changes = APIRouter(dependencies=[access.EDIT_RULES])


def apply_rules(entries: Any) -> tuple[bool, str]:
    """Apply ``entries`` through the rule store (all or nothing) and say what happened, in
    the words `velocity rules` prints."""
    from velocity.delta.names import RULES
    from velocity.delta.rule_store import RuleStore
    from velocity.domain.rule_changes import outcome_lines

    try:
        result = RuleStore(access.settings().table_path(RULES)).apply(entries)
    except Exception as exc:  # the page says why nothing changed, as the CLI would
        return False, f"error: {exc}"
    return True, "\n".join(outcome_lines(result, entries))


def _run_rules_command(args: list[str]) -> tuple[bool, str]:
    """`velocity rules …` with the connection's settings, one at a time."""
    with _CLEAR_STATE:
        try:
            return command_outcome(access.hook().run(args, timeout=300))
        except subprocess.TimeoutExpired:
            return False, (
                f"velocity {' '.join(args)} did not finish within 300 s; it may still have "
                "applied: check the rules in force before trying again"
            )


def command_outcome(result: Any) -> tuple[bool, str]:
    """What the page says of a finished `velocity` command: what it printed on success,
    its error lines otherwise (the JVM's start-up chatter on stderr left out)."""
    if result.returncode == 0:
        return True, result.stdout.strip() or "done"
    noise = ("Picked up ", "WARNING: ", "Setting default log level", "To adjust logging level")
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not line.startswith(noise) and " WARN " not in line
    ]
    return False, "\n".join(lines[-12:]) or f"velocity exited {result.returncode}"


def _shadow_rules(
    request: Request, user: Any, rules_json: str, entries: Any, back: str = ""
) -> RedirectResponse | HTMLResponse:
    """Every rule of ``entries`` as a SHADOW candidate, whatever its ruleState says, as
    `velocity rules shadow` adds them."""
    from velocity.domain.rule_changes import as_candidates
    from velocity.errors import UsageError

    try:
        candidates = as_candidates(entries)
    except UsageError as exc:
        return home.page_again(request, user, rules_json, Flash(False, f"error: {exc}"), back)
    return common.back(*apply_rules(candidates), back)


def rule_part(request: Request, user: Any, rule_id: int) -> common.Parts:
    """The row of rule ``rule_id`` as it stands (none when no rule of that id is in force:
    deleted), the part a change of it redraws in place: its version and state, outcome,
    alerts a minute, and its SHADOW candidate if one stands."""
    from velocity.delta.reader import rule_history
    from velocity.domain.rule_changes import RuleBook

    settings = access.settings()
    history = rule_history(settings)
    book = RuleBook.of(history)
    standing = book.standing().get(rule_id)
    if standing is None:
        return {f"rule-{rule_id}": ""}
    now_ms = int(time.time() * 1000)
    data = PageData(
        user=user.get_name(),
        can_edit=access.can_edit(user),
        base=URL_PREFIX,
        now_ms=now_ms,
        csrf=access.csrf_token(request),
    )
    data.rule_rates, data.rates_error = common.read(
        "alerts a minute", lambda: home.rule_rates(settings, [rule_id], now_ms)
    )
    return {f"rule-{rule_id}": rule_row(standing, data, book.candidates.get(rule_id))}


def _rule_change(
    request: Request, user: Any, rule_id: int, ok: bool, text: str, back: str
) -> Response:
    """A rule change's answer: the redirect back to the page, or its row redrawn in place
    (422 when the change was refused: the rule as it stands)."""
    parts = lambda: rule_part(request, user, rule_id)  # noqa: E731
    return common.answer(request, ok, text, back, parts=parts, refused=422)


@changes.post("/rules/{rule_id}/outcome")
def change_rule_outcome(
    rule_id: int,
    request: Request,
    user: access.Editor,
    outcome: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> Response:
    """Set the outcome (ALERT, REVIEW or BLOCK) of the rule in force: a new version, the
    same but for its outcome, as a rules file with that outcome would make. (Before the
    generic action route, which would take ``outcome`` for an action.)"""
    from velocity.domain.rule_changes import outcome_change
    from velocity.errors import UsageError

    try:
        change = outcome_change(rule_id, outcome)
    except UsageError as exc:
        return _rule_change(request, user, rule_id, False, f"error: {exc}", back)
    return _rule_change(request, user, rule_id, *apply_rules([change]), back)


@changes.post("/rules/{rule_id}/{action}")
def change_rule_state(
    rule_id: int,
    action: str,
    request: Request,
    user: access.Editor,
    back: Annotated[str, Form()] = "",
) -> Response:
    """Pause, activate or delete the rule in force; promote the SHADOW candidate of
    ``rule_id`` to its ACTIVE version, or discard it (`velocity rules ACTION ID`)."""
    from velocity.domain.rule_changes import RULE_ACTIONS, rule_action

    if action not in RULE_ACTIONS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no rule action {action!r}")
    ok, text = apply_rules([rule_action(action, rule_id)])
    if action in IN_PLACE_ACTIONS:
        return _rule_change(request, user, rule_id, ok, text, back)
    return common.back(ok, text, back)


@changes.post("/rules", response_model=None)
def add_rules(
    request: Request,
    user: access.Editor,
    rules_json: Annotated[str, Form()] = "",
    intent: Annotated[str, Form()] = "validate",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse | HTMLResponse:
    from velocity.domain.rules import Control, ControlType, parse_rules
    from velocity.errors import InvalidRuleError, UsageError

    try:
        entries = parse_rules(rules_json)
    except InvalidRuleError as exc:
        # The lines `velocity rules validate` prints, so the page and the CLI agree.
        text = "invalid rules, nothing applied:\n" + "\n".join(f"  {p}" for p in exc.problems)
        return home.page_again(request, user, rules_json, Flash(False, text), back)
    except UsageError as exc:
        return home.page_again(request, user, rules_json, Flash(False, f"error: {exc}"), back)
    if intent == "shadow":
        return _shadow_rules(request, user, rules_json, entries, back)
    if intent != "apply":
        text = f"{len(entries)} valid rule entries"
        return home.page_again(request, user, rules_json, Flash(True, text), back)
    clear_state = ControlType.CLEAR_STATE_ALL
    if not any(isinstance(e, Control) and e.control_type is clear_state for e in entries):
        return common.back(*apply_rules(entries), back)
    with tempfile.TemporaryDirectory(prefix="velocity-rules-") as folder:
        path = Path(folder) / "rules.json"
        path.write_text(rules_json, encoding="utf-8")
        ok, text = _run_rules_command(["rules", "apply", str(path)])
    return common.back(ok, text, back)


@router.get("/api/rules")
def rules_json() -> Response:
    """The rules in force and the SHADOW candidates beside them (a candidate shares its
    ruleId with the rule it would replace: ``ruleState`` tells them apart), by (ruleId,
    version), each with its version and outcome."""
    from velocity.delta.reader import rules_in_force
    from velocity.domain.decimals import dumps_json

    # dumps_json keeps a decimal limit exact (a float would round it).
    # Each with its outcome, ALERT too (to_json leaves out the default).
    rules = [
        {"version": r.version, **r.to_json(), "outcome": r.outcome.value}
        for r in rules_in_force(access.settings())
    ]
    return Response(dumps_json(rules), media_type="application/json")
