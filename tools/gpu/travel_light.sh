#!/usr/bin/env bash
# The device tool carries the working tree (tracked files and untracked ones git does not
# ignore) up to 64 MiB (67.1 MB); with data/traces/seventeenth the tracked tree was 66.5 MB,
# with data/traces/loops 70.3 MB, with loops2 72.1 MB, and the tool refuses it (thirteenth
# and fifteenth out: 65.4 MB).
# For one device call, take some trace sets out of the index and ignore them locally - the
# files stay on disk, no commit changes - and put them back afterwards:
#
#   tools/gpu/travel_light.sh out post fourteenth     # before the device call
#   tools/gpu/travel_light.sh back                    # after it (restores index and ignores)
#
# Do not commit between the two: the sets would be committed as deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."
mark=.git/info/travel-light
case "${1:-}" in
  out)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 out SET... | back" >&2; exit 2; }
    [ ! -e "$mark" ] || { echo "$0: sets already out ($(cat "$mark")): run '$0 back' first" >&2; exit 2; }
    mkdir -p .git/info
    for set in "$@"; do
      [ -d "data/traces/$set" ] || { echo "$0: no set data/traces/$set" >&2; exit 2; }
    done
    cp .git/info/exclude "$mark.exclude" 2>/dev/null || : > "$mark.exclude"
    for set in "$@"; do
      git rm -r -q --cached "data/traces/$set"
      echo "/data/traces/$set/" >> .git/info/exclude
    done
    echo "$*" > "$mark"
    echo "left out of the tree the device tool carries: $*; tracked now $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes"
    ;;
  back)
    [ -e "$mark" ] || { echo "$0: nothing is out" >&2; exit 0; }
    for set in $(cat "$mark"); do git reset -q HEAD -- "data/traces/$set"; done
    mv "$mark.exclude" .git/info/exclude
    [ -s .git/info/exclude ] || rm .git/info/exclude
    echo "back in the index: $(cat "$mark")"
    rm "$mark"
    ;;
  *)
    echo "usage: $0 out SET... | back" >&2
    exit 2
    ;;
esac
