#!/bin/sh
# oomguard-entrypoint: the worker image's ENTRYPOINT (deploy/worker/Dockerfile); its arguments
# (the image's CMD) are the worker's command line, placeholders and all:
#
#   oomguard-entrypoint my-worker --budget {budget}
#
# runs, in this container (so both see this container's memory cgroup):
#
#   oomguard agent --manager "$OOMGUARD_MANAGER" [$OOMGUARD_AGENT_ARGS] &       # this container's report, every 30s
#   oomguard run --manager "$OOMGUARD_MANAGER" [$OOMGUARD_RUN_ARGS] -- my-worker --budget {budget}
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
#   OOMGUARD_RUN_ARGS         extra `oomguard run` flags, split on blanks: --profile porep-c2-32g --isolate
#   OOMGUARD_AGENT_ARGS       extra `oomguard agent` flags, split on blanks: --interval 1m
#   OOMGUARD_SPOOL            the spool both share (read by oomguard; the image sets /var/lib/oomguard/spool)
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

if [ "${OOMGUARD_AGENT:-on}" = off ]; then
    # shellcheck disable=SC2086 # word splitting of $node and $OOMGUARD_RUN_ARGS is wanted
    exec oomguard run --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_RUN_ARGS:-} -- "$@"
fi

# shellcheck disable=SC2086
oomguard agent --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_AGENT_ARGS:-} &
agent=$!
# shellcheck disable=SC2086
oomguard run --manager "$OOMGUARD_MANAGER" $node ${OOMGUARD_RUN_ARGS:-} -- "$@" &
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
