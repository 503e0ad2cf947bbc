#!/usr/bin/env bash
# Makes the tree of Debian arm64 packages that the aarch64 cross build compiles and links
# against, and that qemu-aarch64 loads the test binaries' libraries from. The packages named
# in deploy/arm64/packages.txt are downloaded by apt (the versions this machine's apt index
# names, hashes checked by apt) and unpacked, not installed: nothing of the build machine's
# own packages changes. Installs the cross toolchain and qemu-user when missing, and enables
# the arm64 architecture in apt (dpkg --add-architecture) to read its package index.
#
# Usage: bash deploy/arm64/sysroot.sh [--root DIR]        (default build/arm64-root)
#        bash deploy/arm64/sysroot.sh --list-runtime BUILD  (prints the packages that hold the
#            shared libraries an x86-64 build's binaries load: the runtime half of the list)
# Downloads are kept in build/arm64-debs; a second run with the same versions unpacks nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

root="build/arm64-root"
debs="build/arm64-debs"
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --list-runtime)
      build="$2"
      find "$build" -type f \( -perm -u+x -o -name '*.so' \) -print0 |
        xargs -0 file | awk -F: '/ELF/ {print $1}' | xargs -r ldd 2>/dev/null |
        awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
        while read -r lib; do
          dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
        done | awk -F: '{print $1}' | sort -u |
        grep -vxE 'libc6|libgcc-s1|libstdc\+\+6|libgomp1|libquadmath0'
      exit 0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "sysroot.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

tools=()
for p in g++-aarch64-linux-gnu qemu-user; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || tools+=("$p")
done
need_update=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "sysroot.sh: enabling the arm64 architecture in apt" >&2
  $sudo dpkg --add-architecture arm64
  need_update=1
fi
if ! apt-cache show --no-all-versions libgrpc++-dev:arm64 >/dev/null 2>&1; then need_update=1; fi
if [ "$need_update" = 1 ] || [ ${#tools[@]} -gt 0 ]; then $sudo apt-get update -qq; fi
if [ ${#tools[@]} -gt 0 ]; then
  echo "sysroot.sh: installing ${tools[*]}" >&2
  $sudo apt-get install -y -qq --no-install-recommends "${tools[@]}"
fi

mapfile -t packages < <(sed 's/#.*//' deploy/arm64/packages.txt | tr -s ' \t' '\n' | grep -v '^$')
# Architecture-independent packages (headers only) are named without the :arm64 suffix.
mapfile -t arch_all < <(apt-cache show --no-all-versions "${packages[@]}" 2>/dev/null |
  awk '/^Package:/ {p = $2} /^Architecture: all/ {print p}' | sort -u)
names=()
for p in "${packages[@]}"; do
  if printf '%s\n' "${arch_all[@]}" | grep -qxF "$p"; then names+=("$p"); else names+=("$p:arm64"); fi
done
mkdir -p "$debs"
# 'URI' FILE SIZE HASH per package: the file names carry the versions. (Asked from an empty
# directory: apt leaves out the packages already downloaded to the current one.)
empty="$(mktemp -d)"
uris="$(cd "$empty" && apt-get download --print-uris "${names[@]}")"
rmdir "$empty"
mapfile -t files < <(awk '{print $2}' <<<"$uris" | sort)
missing=()
for i in "${!packages[@]}"; do
  file="$(awk -v p="${packages[$i]}" '{split($2, f, "_"); if (f[1] == p) print $2}' <<<"$uris")"
  [ -n "$file" ] && [ -f "$debs/$file" ] || missing+=("${names[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "sysroot.sh: downloading ${#missing[@]} of ${#packages[@]} arm64 packages" >&2
  (cd "$debs" && apt-get download -qq "${missing[@]}")
fi

stamp="$root/.tophat-packages"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(printf '%s\n' "${files[@]}")" ]; then
  echo "sysroot.sh: $root is up to date (${#files[@]} packages)" >&2
  exit 0
fi
echo "sysroot.sh: unpacking ${#files[@]} packages into $root" >&2
rm -rf "$root"
mkdir -p "$root"
for f in "${files[@]}"; do dpkg-deb -x "$debs/$f" "$root"; done

# Absolute symlinks point into the build machine's own /usr: re-point them into the tree.
root_abs="$(cd "$root" && pwd)"
find "$root" -type l -lname '/*' -print0 | while IFS= read -r -d '' link; do
  ln -sfn "$root_abs$(readlink "$link")" "$link"
done
printf '%s\n' "${files[@]}" >"$stamp"
echo "sysroot.sh: done: $(du -sh "$root" | cut -f1) in $root" >&2
