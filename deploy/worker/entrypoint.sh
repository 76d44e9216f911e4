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
#   oomguard agent --manager "$OOMGUARD_MANAGER" [$OOMGUARD_AGENT_ARGS] &       # this container's report, every 30s
#   oomguard run --manager "$OOMGUARD_MANAGER" [$OOMGUARD_RUN_ARGS] [$OOMGUARD_PLAN_ARGS] -- my-worker --budget {budget}
#
# A failed gate step starts nothing: the container exits with that step's status (3: a threshold
# not met, 4: verify failed, 2: a bad flag), after one line naming the step. The seed's fleet
# ran a benchmark before a node took work; this is that step, configurable.
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
#   OOMGUARD_AGENT            "off": no agent here (events only, e.g. when something else reports)
#   OOMGUARD_RUN_ARGS         extra `oomguard run` flags, split on blanks: --max-restarts 10 --isolate
#   OOMGUARD_AGENT_ARGS       extra `oomguard agent` flags, split on blanks: --interval 1m
#   OOMGUARD_SPOOL            the spool both share (read by oomguard; the image sets /var/lib/oomguard/spool)
# The gate:
#   OOMGUARD_GATE             "off": no gate (default on)
#   OOMGUARD_REQUIRE          `check --require SIZE`: the least budget to start with (default 1B: any budget
#                             above 0; a budget of 0 means the container's limit is too small for oomguard's margin)
#   OOMGUARD_CHECK_ARGS       extra `oomguard check` flags (budget flags: --budget, --margin)
#   OOMGUARD_PLAN_ARGS        the job shape and budget flags, given to `plan`, `verify` and `run` alike:
#                             --profile porep-c2-32g (without it there is no plan step)
#   OOMGUARD_REQUIRE_JOBS     `plan --require-jobs N` (default 1)
#   OOMGUARD_VERIFY           "on": also `oomguard verify` (allocates the plan for real; default off)
#   OOMGUARD_VERIFY_ARGS      extra `oomguard verify` flags: --fraction 0.5 --hold 3
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

# gate STEP ARGS...: run `oomguard STEP ARGS...`; on failure, one line and exit with its status.
gate() {
    step=$1
    status=0
    oomguard "$@" || status=$?
    if [ "$status" -ne 0 ]; then
        echo "oomguard-entrypoint: gate: oomguard $step failed (exit $status); not starting the worker (OOMGUARD_GATE=off skips the gate)" >&2
        exit "$status"
    fi
}

if [ "${OOMGUARD_GATE:-on}" != off ]; then
    # shellcheck disable=SC2086 # word splitting of the *_ARGS variables is wanted
    gate check --require "${OOMGUARD_REQUIRE:-1B}" ${OOMGUARD_CHECK_ARGS:-}
    if [ -n "${OOMGUARD_PLAN_ARGS:-}" ]; then
        # shellcheck disable=SC2086
        gate plan --require-jobs "${OOMGUARD_REQUIRE_JOBS:-1}" $OOMGUARD_PLAN_ARGS
    fi
    if [ "${OOMGUARD_VERIFY:-off}" = on ]; then
        # shellcheck disable=SC2086
        gate verify ${OOMGUARD_PLAN_ARGS:-} ${OOMGUARD_VERIFY_ARGS:-}
    fi
fi

node=
if [ -n "${OOMGUARD_NODE:-}" ]; then
    node="--node $OOMGUARD_NODE"
fi

if [ "${OOMGUARD_AGENT:-on}" = off ]; then
    # shellcheck disable=SC2086 # word splitting of $node and $OOMGUARD_RUN_ARGS is wanted
    exec oomguard run --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_RUN_ARGS:-} ${OOMGUARD_PLAN_ARGS:-} -- "$@"
fi

# shellcheck disable=SC2086
oomguard agent --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_AGENT_ARGS:-} &
agent=$!
# shellcheck disable=SC2086
oomguard run --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_RUN_ARGS:-} ${OOMGUARD_PLAN_ARGS:-} -- "$@" &
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
