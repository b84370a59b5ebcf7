#!/usr/bin/env bash
# Provide ONNX Runtime's C/C++ API headers for building the onnxnorm custom-op library.
#
# The headers are needed at build time only (the library links nothing from ONNX Runtime).
# Sources, in order of preference; the first that works is used and named in one line:
#   1. $ONNXRUNTIME_INCLUDE_DIR, if set (it must hold onnxruntime_c_api.h)
#   2. /usr/include/onnxruntime (Debian/Ubuntu package libonnxruntime-dev)
#   3. third_party/onnxruntime/include/ in this checkout, if already filled
#   4. libonnxruntime-dev from Debian trixie, fetched with apt-get download through a temporary
#      sources list that reuses this machine's Debian mirror and keyring; nothing is installed
#   5. the upstream release archive from GitHub (needs curl and internet access)
# Sources 4 and 5 fill third_party/onnxruntime/include/ (gitignored). Nothing system-wide changes.
#
# Environment: ONNXRUNTIME_INCLUDE_DIR (see 1); ONNXNORM_DEBIAN_SUITE (suite for 4, default trixie);
# ONNXNORM_ORT_VERSION (release for 5, default 1.21.0); ONNXNORM_ORT_BASE_URL (where 5 downloads
# from, default https://github.com/microsoft/onnxruntime/releases/download, e.g. for a mirror).
set -euo pipefail
shopt -s nullglob

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$repo_root/third_party/onnxruntime/include"
ort_version="${ONNXNORM_ORT_VERSION:-1.21.0}"
ort_base_url="${ONNXNORM_ORT_BASE_URL:-https://github.com/microsoft/onnxruntime/releases/download}"
suite="${ONNXNORM_DEBIAN_SUITE:-trixie}"
apt_etc="${ONNXNORM_APT_ETC:-/etc/apt}"  # where the apt sources are read from (for testing)

have_headers() {  # $1: a folder
  [[ -f "$1/onnxruntime_c_api.h" && -f "$1/onnxruntime_cxx_api.h" ]]
}

fail() {
  {
    echo "get_ort_headers: $*"
    echo "get_ort_headers: provide the ONNX Runtime C/C++ API headers (1.21 or newer) yourself:"
    echo "  unpack an ONNX Runtime release (https://github.com/microsoft/onnxruntime/releases) or"
    echo "  install libonnxruntime-dev, then export ONNXRUNTIME_INCLUDE_DIR=/path/to/folder/holding/onnxruntime_c_api.h"
  } >&2
  exit 1
}

# 1. explicit folder
if [[ -n "${ONNXRUNTIME_INCLUDE_DIR:-}" ]]; then
  if [[ -f "$ONNXRUNTIME_INCLUDE_DIR/onnxruntime_c_api.h" ]]; then
    echo "ONNX Runtime headers: ONNXRUNTIME_INCLUDE_DIR=$ONNXRUNTIME_INCLUDE_DIR"
    exit 0
  fi
  fail "ONNXRUNTIME_INCLUDE_DIR=$ONNXRUNTIME_INCLUDE_DIR does not hold onnxruntime_c_api.h"
fi

# 2. system package
if [[ -f /usr/include/onnxruntime/onnxruntime_c_api.h ]]; then
  echo "ONNX Runtime headers: system package (/usr/include/onnxruntime)"
  exit 0
fi

# 3. already fetched into this checkout
if have_headers "$dest"; then
  echo "ONNX Runtime headers: $dest (already present)"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/onnxnorm-ort-headers.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log="$work/log.txt"
: >"$log"

# Copies the headers in folder $1 into $dest via a staging folder, so that an interrupted copy
# never looks like a filled folder.
install_headers() {
  local src="$1" stage
  have_headers "$src" || return 1
  mkdir -p "$(dirname "$dest")"
  stage="$(mktemp -d "$(dirname "$dest")/.include.XXXXXX")"
  cp -R "$src"/. "$stage"/
  chmod 755 "$stage"
  rm -rf "$dest"
  mv "$stage" "$dest"
}

# Prints "URI<TAB>KEYRING" for the machine's Debian archive (not -security), read from the apt
# sources: deb822 files first, then the one-line format. KEYRING is empty when none is named.
debian_mirror() {
  local f
  for f in "$apt_etc"/sources.list.d/*.sources; do
    # Stanzas are separated by blank lines; keep the first enabled deb stanza with a .../debian URI.
    awk '
      function flush() {
        if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled !~ /^[ \t]*no[ \t]*$/ && uri != "" && !done) {
          print uri "\t" key; done = 1
        }
        types = ""; uri = ""; key = ""; enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      {
        line = $0
        if (match(line, /^[A-Za-z-]+:/)) {
          field = tolower(substr(line, 1, RLENGTH - 1)); value = substr(line, RLENGTH + 1)
          gsub(/^[ \t]+|[ \t]+$/, "", value)
          if (field == "types") types = value
          else if (field == "enabled") enabled = tolower(value)
          else if (field == "signed-by" && value ~ /^\//) key = value
          else if (field == "uris") {
            n = split(value, parts, /[ \t]+/)
            for (i = 1; i <= n; i++) {
              u = parts[i]; sub(/\/+$/, "", u)
              if (u ~ /\/debian$/) { uri = u; break }
            }
          }
        }
      }
      END { flush() }
    ' "$f"
  done | head -n 1 | grep . && return 0
  local lists=()
  [[ -f "$apt_etc/sources.list" ]] && lists+=("$apt_etc/sources.list")
  lists+=("$apt_etc"/sources.list.d/*.list)
  ((${#lists[@]})) || return 1
  # deb [opt=val ...] URI suite components...
  awk '
    $1 != "deb" { next }
    {
      key = ""; i = 2
      if ($2 ~ /^\[/) {
        opts = $0; sub(/^[^[]*\[/, "", opts); sub(/\].*$/, "", opts)
        n = split(opts, o, /[ \t]+/)
        for (j = 1; j <= n; j++) if (o[j] ~ /^signed-by=\//) { key = o[j]; sub(/^signed-by=/, "", key) }
        while (i <= NF && $i !~ /\]$/) i++
        i++
      }
      u = $i; sub(/\/+$/, "", u)
      if (u ~ /\/debian$/) { print u "\t" key; exit }
    }
  ' "${lists[@]}" | head -n 1 | grep .
}

# 4. Debian package, downloaded (not installed) through a temporary sources list
from_debian() {
  if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    echo "apt-get or dpkg not found" >>"$log"
    return 2
  fi
  tried+=("Debian $suite package libonnxruntime-dev via apt-get download")
  local mirror uri key line
  mirror="$(debian_mirror 2>>"$log")" || { echo "no Debian mirror found in the apt sources" >>"$log"; return 1; }
  uri="${mirror%%$'\t'*}"
  key="${mirror#*$'\t'}"
  local t="$work/apt"
  mkdir -p "$t/lists/partial" "$t/cache/archives/partial" "$t/none" "$t/deb" "$t/root"
  chmod -R a+rwX "$t"  # apt run as root downloads as the _apt user
  if [[ -n "$key" && -r "$key" ]]; then
    line="deb [signed-by=$key] $uri $suite main"
  else
    line="deb $uri $suite main"
  fi
  echo "$line" >"$t/sources.list"
  local opts=(
    -o "Dir::Etc::SourceList=$t/sources.list"
    -o "Dir::Etc::SourceParts=$t/none"
    -o "Dir::State::Lists=$t/lists"
    -o "Dir::Cache=$t/cache"
    -o "Dir::State::status=/dev/null"
  )
  echo "+ apt-get update ($line)" >>"$log"
  apt-get "${opts[@]}" update >>"$log" 2>&1 || return 1
  echo "+ apt-get download libonnxruntime-dev" >>"$log"
  (cd "$t/deb" && apt-get "${opts[@]}" download libonnxruntime-dev) >>"$log" 2>&1 || return 1
  local debs=("$t"/deb/libonnxruntime-dev_*.deb)
  ((${#debs[@]})) || { echo "no .deb downloaded" >>"$log"; return 1; }
  dpkg -x "${debs[0]}" "$t/root" >>"$log" 2>&1 || return 1
  install_headers "$t/root/usr/include/onnxruntime" || { echo "the package holds no headers" >>"$log"; return 1; }
  deb_name="$(basename "${debs[0]}")"
}

# 5. upstream release archive
from_github() {
  command -v curl >/dev/null 2>&1 || { echo "curl not found" >>"$log"; return 2; }
  local arch
  case "$(uname -m)" in
    x86_64 | amd64) arch=x64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *) echo "no upstream Linux release for $(uname -m)" >>"$log"; return 2 ;;
  esac
  local name="onnxruntime-linux-$arch-$ort_version" found
  gh_url="${ort_base_url%/}/v$ort_version/$name.tgz"
  tried+=("upstream release archive $gh_url via curl")
  echo "+ curl $gh_url" >>"$log"
  curl -fsSL --retry 2 --connect-timeout 20 -o "$work/$name.tgz" "$gh_url" >>"$log" 2>&1 || return 1
  mkdir -p "$work/gh"
  tar -xzf "$work/$name.tgz" -C "$work/gh" >>"$log" 2>&1 || return 1
  found="$(find "$work/gh" -name onnxruntime_c_api.h -print | head -n 1)"
  [[ -n "$found" ]] && install_headers "$(dirname "$found")" ||
    { echo "the archive holds no headers" >>"$log"; return 1; }
}

deb_name=""
gh_url=""
tried=()
if from_debian; then
  echo "ONNX Runtime headers: Debian $suite package $deb_name -> $dest"
  exit 0
fi
if from_github; then
  echo "ONNX Runtime headers: upstream release $ort_version ($gh_url) -> $dest"
  exit 0
fi
sed 's/^/  | /' "$log" >&2
if ((${#tried[@]})); then
  fail "could not fetch the headers (tried: $(IFS=';'; echo "${tried[*]}" | sed 's/;/; /g'); log above)"
fi
fail "could not fetch the headers: neither apt-get/dpkg nor curl is available"
