# A one-node Slurm on localhost for the tests, everything under one folder.
# Sourced:   source local_slurm.sh; local_slurm_start "$work/slurm"
# Needs root (SlurmUser=root, as CI runs) and Debian's slurm-wlm + munge.
#
# 1. munged with a key made here, listening on a socket in the folder.
# 2. slurm.conf: free ports, state and spool in the folder, processes
#    tracked by /proc (no cgroups), no task binding, one node "localhost"
#    of 4 CPUs whatever the machine has (config_overrides), oversubscribed,
#    jobs requeueable, the queue looked at every second (not 60).
# 3. slurmctld and slurmd in the foreground (-D) of background jobs, then
#    wait for the node to be idle.
# local_slurm_stop (installed by start as an EXIT trap, also run on INT/TERM) stops the three
# jobs still in the queue, then the daemons it started (by pid), and waits
# for them.

local_slurm_pids=()

local_slurm_stop() {
  local pid jobs
  # Jobs first: their processes (slurmstepd and the ranks) are not the
  # daemons' children and would outlive them.
  jobs=$(squeue -h -o %A 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 100); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.1; done
  fi
  for pid in "${local_slurm_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${local_slurm_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  local_slurm_pids=()
}

local_slurm_free_ports() {  # N: N distinct free TCP ports
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

local_slurm_write_conf() {  # DIR CTLD_PORT SLURMD_PORT
  local dir=$1
  cat > "$dir/slurm.conf" <<EOF
ClusterName=meshtron-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$2
SlurmdPort=$3
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobRequeue=1
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  # Read by slurmd even without cgroup plugins in use; autodetect keeps it quiet.
  echo "CgroupPlugin=autodetect" > "$dir/cgroup.conf"
}

local_slurm_start() {  # DIR
  local dir=$1
  rm -rf "$dir" && mkdir -p "$dir"/{state,spool,log,munge}
  chmod 700 "$dir/munge"
  head -c 1024 /dev/urandom > "$dir/munge/munge.key"
  chmod 600 "$dir/munge/munge.key"
  trap local_slurm_stop EXIT
  trap 'exit 130' INT  # so that EXIT runs on a signal too
  trap 'exit 143' TERM
  # -f: the folder sits under /tmp or a build tree, whose permissions
  # munged would otherwise refuse.
  munged -F -f --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
         --log-file="$dir/munge/munged.log" --pid-file="$dir/munge/munged.pid" \
         --seed-file="$dir/munge/munged.seed" > "$dir/log/munged.out" 2>&1 &
  local_slurm_pids+=($!)
  read -r ctld_port slurmd_port < <(local_slurm_free_ports 2)
  local_slurm_write_conf "$dir" "$ctld_port" "$slurmd_port"
  export SLURM_CONF=$dir/slurm.conf
  for _ in $(seq 50); do [[ -S $dir/munge/munge.socket ]] && break; sleep 0.1; done
  slurmctld -D -i -f "$SLURM_CONF" > "$dir/log/slurmctld.out" 2>&1 &
  local_slurm_pids+=($!)
  slurmd -D -N localhost -f "$SLURM_CONF" > "$dir/log/slurmd.out" 2>&1 &
  local_slurm_pids+=($!)
  for _ in $(seq 300); do
    [[ $(sinfo -h -n localhost -o %t 2>/dev/null) == idle ]] && return 0
    sleep 0.1
  done
  echo "FAIL: the local Slurm did not come up; its logs:" >&2
  tail -n 20 "$dir"/log/* >&2
  return 1
}
