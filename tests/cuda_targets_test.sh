#!/usr/bin/env bash
# What the CUDA kernels in a built program hold, as cuobjdump reads them: machine code for
# every architecture asked for (CMAKE_CUDA_ARCHITECTURES, e.g. "90": H100/H200) and PTX for
# the newest, so that newer GPUs compile it at load time. A build whose architectures were
# dropped (PyTorch's CMake config resets CMAKE_CUDA_ARCHITECTURES: cmake/find_torch.cmake)
# would hold only nvcc's default target and fail here.
#   cuda_targets_test.sh CUOBJDUMP PROGRAM "ARCHITECTURES"
set -euo pipefail
cuobjdump="$1"; program="$2"; architectures="$3"
elf=$("$cuobjdump" --list-elf "$program")
ptx=$("$cuobjdump" --list-ptx "$program")
status=0
newest=0
for arch in ${architectures//;/ }; do
  kind="${arch#*-}"; number="${arch%%-*}"
  [ "$kind" = "$arch" ] && kind=both
  [ "$number" -gt "$newest" ] && newest=$number
  if [ "$kind" != virtual ] && ! grep -q "\.sm_${number}\.cubin" <<<"$elf"; then
    echo "no sm_${number} machine code in $program"; status=1
  fi
done
if ! grep -q "\.sm_${newest}\.ptx" <<<"$ptx"; then
  echo "no PTX for compute_${newest} in $program"; status=1
fi
# Nothing for an architecture nobody asked for (nvcc's default when the list was lost).
asked=" $(echo ${architectures//;/ } | sed 's/-[a-z]*//g') "
for found in $(grep -o 'sm_[0-9]*' <<<"$elf$ptx" | sort -u); do
  if [[ "$asked" != *" ${found#sm_} "* ]]; then
    echo "$found code in $program, not asked for ($architectures)"; status=1
  fi
done
echo "$program: $(grep -c cubin <<<"$elf") cubin(s), $(grep -c ptx <<<"$ptx") PTX file(s), for $architectures"
exit $status
