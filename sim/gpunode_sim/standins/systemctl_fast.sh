#!/bin/sh
# Fast path of the simulated nodes' systemctl (docker-systemctl-replacement, /usr/bin/systemctl) for
# `systemctl is-active UNIT...`, the one systemctl call on the deploy's hot path: the full stand-in is Python
# and costs ~40 ms per call (interpreter, imports, unit scan), a real systemctl a few. It answers as that
# stand-in does (same lines, same exit code) where a unit is a plain service file without PIDFile,
# StatusFile (nor drop-ins that set them), and its state is in /run/UNIT.status; anything else (options,
# patterns, other unit types, aliases, SysV scripts) goes to the full stand-in. tests/test_systemctl_fast.py
# compares both (the two variables below let it run both on a unit tree of its own, as the full stand-in's
# --root does).
FULL=${GPUNODE_SIM_SYSTEMCTL:-/usr/bin/systemctl}
root=${GPUNODE_SIM_SYSTEMCTL_ROOT:-}
FOLDERS="/etc/systemd/system /run/systemd/system /var/run/systemd/system /usr/local/lib/systemd/system
/usr/lib/systemd/system /lib/systemd/system"

# $trimmed: $1 without the blanks around it (no subshell: this runs on every deploy's hot path)
trim() {
  trimmed=${1#"${1%%[![:space:]]*}"}
  trimmed=${trimmed%"${trimmed##*[![:space:]]}"}
}

zombie() {
  [ -r "/proc/$1/status" ] || return 1
  while IFS= read -r line; do
    case "$line" in State:*Z*) return 0 ;; State:*) return 1 ;; esac
  done < "/proc/$1/status"
  return 1
}

# a unit file or drop-in that does not mention PIDFile or StatusFile (any mention, even a comment, goes to the
# full stand-in)
plain() {
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in *PIDFile*|*StatusFile*) return 1 ;; esac
  done < "$1"
}

# one unit's state in $state (no subshell); exit 1 = not sure, ask the full stand-in
unit_state() {
  case "$1" in
    ''|*[!A-Za-z0-9_.-]*) return 1 ;;
    *.service) name=$1 ;;
    *.*) return 1 ;;
    *) name=$1.service ;;
  esac
  found=
  for folder in $FOLDERS; do
    file=$root$folder/$name
    if [ -d "$file.d" ]; then  # drop-ins (*.conf, as the stand-in reads them) may set what decides the state
      for dropin in "$file.d"/*.conf; do
        [ -e "$dropin" ] || [ -L "$dropin" ] || continue
        [ -f "$dropin" ] && [ ! -L "$dropin" ] && plain "$dropin" || return 1
      done
    fi
    if [ -L "$file" ] || { [ -e "$file" ] && [ ! -f "$file" ]; }; then return 1; fi
    [ -f "$file" ] || continue
    plain "$file" || return 1
    found=1
  done
  if [ -z "$found" ]; then
    for folder in /etc/init.d /run/init.d /var/run/init.d; do
      [ -e "$root$folder/${name%.service}" ] && return 1
    done
    state=not-found
    return 0
  fi
  status=$root/run/$name.status
  active= pid=
  if [ -s "$status" ]; then  # key=value lines; the last of a key wins; values trimmed (shell builtins only)
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in
        ActiveState[:=]*) trim "${line#ActiveState?}"; active=$trimmed ;;
        MainPID[:=]*) trim "${line#MainPID?}"; pid=$trimmed ;;
      esac
    done < "$status"
  fi
  if [ -n "$active" ]; then state=$active; return 0; fi
  case "$pid" in
    '') state=inactive ;;
    *[!0-9]*) return 1 ;;
    0) state=inactive ;;
    0*) return 1 ;;
    *)
      # the node's /proc is the init's process table (a pod chrooted into the host shares no PID namespace)
      if [ -d "/proc/$pid" ] && ! zombie "$pid"; then state=active; else state=failed; fi ;;
  esac
}

if [ "$1" = is-active ] && [ $# -gt 1 ]; then
  shift
  lines= errors= rc=0
  for unit do
    case "$unit" in -*) exec "$FULL" is-active "$@" ;; esac
    unit_state "$unit" || exec "$FULL" is-active "$@"
    if [ "$state" = not-found ]; then
      errors="${errors}ERROR:systemctl:Unit $name not found.
"
      state=inactive
    fi
    [ "$state" = active ] || rc=3
    lines="$lines$state
"
  done
  printf '%s' "$errors" >&2
  printf '%s' "$lines"
  exit $rc
fi
exec "$FULL" "$@"
