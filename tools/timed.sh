#!/usr/bin/env bash
# tools/timed.sh NAME COMMAND...: run COMMAND, then print one line with NAME, its minutes and whether it passed; the
# exit status is COMMAND's. CI's log shows each tier's cost on a green run as on a red one.
name=$1
shift
began=$SECONDS
"$@"
status=$?
spent=$((SECONDS - began))
outcome=$([ "$status" = 0 ] && echo passed || echo "failed (exit $status)")
printf '==== tier %s: %d min %02d s, %s ====\n' "$name" $((spent / 60)) $((spent % 60)) "$outcome"
exit "$status"
