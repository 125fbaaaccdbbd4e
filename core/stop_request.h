// Graceful stopping on the signals schedulers and people send: SIGTERM (Slurm's pre-emption,
// `kill`), SIGINT (Ctrl-C) and SIGUSR1 (Slurm's usual early warning, `--signal=USR1@90`).
// The first such signal only records that a stop was asked for; the training loop reads the
// flag at its next step boundary, agrees on it with the other ranks inside a sum the step
// does anyway, writes a checkpoint and exits. A second signal ends the process at once, without
// the checkpoint the stop would write; but where a checkpoint is being written in the
// background (begun before the stop), the process ends as soon as that one is complete:
// throwing it away could leave no checkpoint at all.
// The handler touches nothing but an atomic flag and write(2): async-signal-safe.
#pragma once

namespace freeride {

// Installs the handlers (idempotent). Returns false if sigaction refused one.
bool InstallStopHandlers();

// What the handler prints at the first stop signal; the default promises the training loop's
// checkpoint. A command that stops otherwise (a study writes no checkpoint) says so here.
// `notice` must live until the process ends (a string literal).
void SetStopNotice(const char* notice);

// The signal number of the first stop request, or 0 when none arrived.
int StopRequestedBy();

// Bracket a background checkpoint write, from its start until the checkpoint is complete on
// disk (or abandoned). A second stop signal that arrives in between is deferred: the last
// EndCheckpointWrite then exits the process with the status the signal would have.
void BeginCheckpointWrite();
void EndCheckpointWrite();

// Forgets a recorded request (tests; a process that handled its stop and goes on).
void ClearStopRequest();

// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
const char* StopSignalName(int signal_number);

}  // namespace freeride
