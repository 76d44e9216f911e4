#!/bin/sh
# oomguard-entrypoint: the worker image's ENTRYPOINT (deploy/worker/Dockerfile); its arguments
# (the image's CMD) are the worker's command line, placeholders and all:
#
#   oomguard-entrypoint my-worker --budget {budget}
#
# runs, in this container (so all see this container's memory cgroup), first a gate:
#
#   oomguard check --require "$OOMGUARD_REQUIRE" [$OOMGUARD_CHECK_ARGS]        # a budget above 0, or above SIZE
#   oomguard plan --require-jobs "$OOMGUARD_REQUIRE_JOBS" $OOMGUARD_PLAN_ARGS  # only with OOMGUARD_PLAN_ARGS
#   oomguard verify $OOMGUARD_PLAN_ARGS [$OOMGUARD_VERIFY_ARGS]                 # only with OOMGUARD_VERIFY=on
#
# and, when all of it passed:
#
#   oomguard agent --manager "$OOMGUARD_MANAGER" [$OOMGUARD_AGENT_ARGS] [$OOMGUARD_PLAN_ARGS] \
#       --gate STEP --gate-exit 0 --gate-message "passed: ..." &              # this container's report, every 30s
#   oomguard run --manager "$OOMGUARD_MANAGER" [--cuzk $OOMGUARD_CUZK_CONFIG] [$OOMGUARD_RUN_ARGS] \
#       [$OOMGUARD_PLAN_ARGS] -- my-worker --budget {budget}
#
# The agent gets the plan arguments too, so its reports carry the plan; its first report is
# followed by a passed gate event (step: the last step run), which clears a node refused before.
#
# A failed gate step starts nothing. The manager is told first, so a node that cannot run is seen:
#
#   oomguard agent --once --max-time 10s --manager "$OOMGUARD_MANAGER" [$OOMGUARD_AGENT_ARGS] \
#       [$OOMGUARD_PLAN_ARGS] --gate STEP --gate-exit STATUS --gate-message "<the step's stderr>"
#
# a one-shot report (with the plan) and a gate event ({"event": "gate", "step", "passed": false,
# "exit_code", "message": the step's error line with its numbers}; docs/agent.md), delivered
# within 10 s or left in the spool for the next start (a refused item goes to its rejected/);
# when the agent cannot take the plan arguments (a bad flag there: exit 2), once more without
# them. Then the container exits with that step's status (3: a threshold not met, 4: verify
# failed, 2: a bad flag), whatever became of the report, after one line naming the step. The
# step's stdout reaches the log as it comes; its stderr once the step has ended. The seed's
# fleet ran a benchmark before a node took work; this is that step, configurable.
#
# oomguard run computes the budget before each start and passes it explicitly ({budget}); the
# worker's own memory detection stays as a second layer. This script stays the agent's parent
# (the supervisor kills every child of its own once the worker exits), forwards TERM, INT and
# HUP to `oomguard run`, and exits with its status (the worker's: 128 + signal when killed).
#
# Environment:
#   OOMGUARD_MANAGER          required: the manager's base URL, e.g. http://oomguard-manager:8080
#   OOMGUARD_AGENT_TOKEN      the agent bearer token; read by oomguard itself, never put on a
#                             command line (ps shows command lines)
#   OOMGUARD_AGENT_TOKEN_FILE or a file holding it (a Docker or Kubernetes secret), read here
#   OOMGUARD_NODE             node name for the manager (default: VAST_CONTAINERLABEL, then the hostname)
#   OOMGUARD_LABELS           the node's labels, KEY=VALUE,... (read by oomguard itself, as are
#                             CONTAINER_ID, VAST_CONTAINERLABEL and K8S_NODE_NAME; docs/agent.md)
#   OOMGUARD_AGENT            "off": no agent here (events only, e.g. when something else reports);
#                             the gate's outcome is still sent, by a one-shot `oomguard agent --once`
#   OOMGUARD_RUN_ARGS         extra `oomguard run` flags, split on blanks: --max-restarts 10 --isolate
#   OOMGUARD_AGENT_ARGS       extra `oomguard agent` flags, split on blanks: --interval 1m --label zone=eu1
#   OOMGUARD_SPOOL            the spool all share (read by oomguard; the image sets /var/lib/oomguard/spool)
# The gate:
#   OOMGUARD_GATE             "off": no gate (default on), and no gate event
#   OOMGUARD_REQUIRE          `check --require SIZE`: the least budget to start with (default 1B: any budget
#                             above 0; a budget of 0 means the container's limit is too small for oomguard's margin)
#   OOMGUARD_CHECK_ARGS       extra `oomguard check` flags (budget flags: --budget, --margin)
#   OOMGUARD_PLAN_ARGS        the job shape and budget flags, given to `plan`, `verify`, `run` and the agent
#                             alike: --profile porep-c2-32g (without it there is no plan step)
#   OOMGUARD_REQUIRE_JOBS     `plan --require-jobs N` (default 1)
#   OOMGUARD_VERIFY           "on": also `oomguard verify` (allocates the plan for real; default off)
#   OOMGUARD_VERIFY_ARGS      extra `oomguard verify` flags: --fraction 0.5 --hold 3
# CuZK (docs/cuzk.md): the public cuzk-daemon takes its budget only from its config file:
#   OOMGUARD_CUZK_CONFIG      the operator's CuZK config (a template, never written): `oomguard run
#                             --cuzk FILE` writes it afresh before each start with [memory] total_budget
#                             = the safe budget in bytes, and passes `--config` the result; a path
#                             without blanks. The CMD is then `cuzk-daemon` (no --config of its own)
#   OOMGUARD_CUZK_OUT         where that config is written (default: beside it, NAME.oomguard.toml;
#                             set it when the template's directory is read-only, e.g. a ConfigMap)
#   OOMGUARD_ALLOW_OVER_LIMIT "1": an explicit budget (OOMGUARD_BUDGET, --budget) above the hard
#                             ceiling passes the gate and `run` (read by oomguard itself; default: every
#                             step refuses it with exit 3, since a worker that uses it is OOM-killed)
set -eu

if [ -z "${OOMGUARD_MANAGER:-}" ]; then
    echo "oomguard-entrypoint: set OOMGUARD_MANAGER to the manager's URL, e.g. http://oomguard-manager:8080" >&2
    exit 2
fi
if [ "$#" -eq 0 ]; then
    echo "oomguard-entrypoint: no worker command (the image's CMD), e.g. my-worker --budget {budget}" >&2
    exit 2
fi
if [ -z "${OOMGUARD_AGENT_TOKEN:-}" ] && [ -n "${OOMGUARD_AGENT_TOKEN_FILE:-}" ]; then
    if ! OOMGUARD_AGENT_TOKEN=$(cat -- "$OOMGUARD_AGENT_TOKEN_FILE"); then
        echo "oomguard-entrypoint: cannot read OOMGUARD_AGENT_TOKEN_FILE=$OOMGUARD_AGENT_TOKEN_FILE" >&2
        exit 2
    fi
    export OOMGUARD_AGENT_TOKEN
fi

set -f # the *_ARGS variables are split on blanks, never globbed

node=
if [ -n "${OOMGUARD_NODE:-}" ]; then
    node="--node $OOMGUARD_NODE"
fi

# agent FLAGS...: exec `oomguard agent` for this node with the plan flags (its reports carry the
# plan); called in a subshell, `( agent ... )` or `agent ... &`, so that $! is the agent itself.
cuzk=
if [ -n "${OOMGUARD_CUZK_CONFIG:-}" ]; then
    cuzk="--cuzk $OOMGUARD_CUZK_CONFIG${OOMGUARD_CUZK_OUT:+ --cuzk-out $OOMGUARD_CUZK_OUT}"
fi

agent() {
    # shellcheck disable=SC2086 # word splitting of $node and the *_ARGS variables is wanted
    exec oomguard agent --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_AGENT_ARGS:-} ${OOMGUARD_PLAN_ARGS:-} "$@"
}

# report_refusal STEP STATUS STDERR: the one-shot report and the gate event, in at most 10 s;
# sets $reported to what became of them, for the last line.
report_refusal() {
    sent=0
    ( agent --once --max-time 10s --gate "$1" --gate-exit "$2" --gate-message "$3" ) || sent=$?
    if [ "$sent" -eq 2 ] && [ -n "${OOMGUARD_PLAN_ARGS:-}" ]; then # a bad flag in the plan's: without them
        sent=0
        ( OOMGUARD_PLAN_ARGS='' agent --once --max-time 10s --gate "$1" --gate-exit "$2" --gate-message "$3" ) || sent=$?
    fi
    case $sent in
        0) reported="reported to the manager" ;;
        75) reported="the report waits in the spool" ;;
        *) reported="not reported (oomguard agent exit $sent)" ;;
    esac
}

# gate STEP ARGS...: run `oomguard STEP ARGS...` (its stderr kept for the gate event, and passed
# on once it has ended); on failure, report it, say one line and exit with the step's status.
gate_step=
gate() {
    gate_step=$1
    status=0
    { err=$(oomguard "$@" 2>&1 >&3 3>&-); } 3>&1 || status=$? # stderr here, stdout (fd 3) to the log
    if [ -n "$err" ]; then
        printf '%s\n' "$err" >&2
    fi
    if [ "$status" -ne 0 ]; then
        # the end of it is enough for its last error line, and keeps the command line short
        report_refusal "$gate_step" "$status" "$(printf '%s\n' "$err" | tail -c 16384)"
        echo "oomguard-entrypoint: gate: oomguard $gate_step failed (exit $status), $reported; not starting the worker (OOMGUARD_GATE=off skips the gate)" >&2
        exit "$status"
    fi
}

passed=
if [ "${OOMGUARD_GATE:-on}" != off ]; then
    # shellcheck disable=SC2086 # word splitting of the *_ARGS variables is wanted
    gate check --require "${OOMGUARD_REQUIRE:-1B}" ${OOMGUARD_CHECK_ARGS:-}
    passed="check --require ${OOMGUARD_REQUIRE:-1B}"
    if [ -n "${OOMGUARD_PLAN_ARGS:-}" ]; then
        # shellcheck disable=SC2086
        gate plan --require-jobs "${OOMGUARD_REQUIRE_JOBS:-1}" $OOMGUARD_PLAN_ARGS
        passed="$passed, plan --require-jobs ${OOMGUARD_REQUIRE_JOBS:-1}"
    fi
    if [ "${OOMGUARD_VERIFY:-off}" = on ]; then
        # shellcheck disable=SC2086
        gate verify ${OOMGUARD_PLAN_ARGS:-} ${OOMGUARD_VERIFY_ARGS:-}
        passed="$passed, verify"
    fi
fi

if [ "${OOMGUARD_AGENT:-on}" = off ]; then
    if [ -n "$gate_step" ]; then # no agent to send it with its first report: a one-shot one
        ( agent --once --max-time 10s --gate "$gate_step" --gate-exit 0 --gate-message "passed: $passed" ) || :
    fi
    # shellcheck disable=SC2086 # word splitting of $node, $cuzk and $OOMGUARD_RUN_ARGS is wanted
    exec oomguard run --manager "$OOMGUARD_MANAGER" $node $cuzk ${OOMGUARD_RUN_ARGS:-} ${OOMGUARD_PLAN_ARGS:-} -- "$@"
fi

if [ -n "$gate_step" ]; then
    agent --gate "$gate_step" --gate-exit 0 --gate-message "passed: $passed" &
else
    agent &
fi
agent=$!
# shellcheck disable=SC2086
oomguard run --manager "$OOMGUARD_MANAGER" $node $cuzk ${OOMGUARD_RUN_ARGS:-} ${OOMGUARD_PLAN_ARGS:-} -- "$@" &
run=$!

forward() {
    kill "-$1" "$run" 2>/dev/null || :
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

# `wait` returns early when a trapped signal arrives: wait again until `oomguard run` is gone.
while :; do
    status=0
    wait "$run" || status=$?
    kill -0 "$run" 2>/dev/null || break
done
kill -TERM "$agent" 2>/dev/null || :
wait "$agent" 2>/dev/null || :
exit "$status"
