#!/usr/bin/env bash
# Install a single-node Slurm cluster with accounting (Debian/Ubuntu, as root, no systemd needed).
# Idempotent: does nothing when every package is already installed.
#   bash slurm/install.sh
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "slurm/install.sh: all packages present"
    exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# Services must not be started by the package scripts (there is no systemd here; start.sh starts them).
if [ ! -e /usr/sbin/policy-rc.d ]; then
    $SUDO sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d'
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "slurm/install.sh: installed ${missing[*]}"
