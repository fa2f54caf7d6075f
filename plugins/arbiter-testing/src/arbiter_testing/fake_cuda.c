/* A stand-in for the CUDA driver library's checkpoint calls, for hosts without an NVIDIA GPU.
 *
 * It exports the symbols the cuda_checkpoint translator looks up (cuInit, cuDriverGetVersion,
 * cuGetErrorName, cuGetErrorString and the cuCheckpointProcess* calls) with the documented
 * signatures and state machine: running -lock-> locked -checkpoint-> checkpointed -restore->
 * locked -unlock-> running.  Each process's CUDA state is a file <FAKE_CUDA_DIR>/<pid> that
 * the test writes ("running") for a process that "uses CUDA"; <pid>.flags may say "uvm"
 * (checkpoint is not supported for its memory) or "busy" (its submitted work never finishes,
 * so a lock times out).  Every call is appended to <FAKE_CUDA_DIR>/calls.log with the target's
 * kernel state (R, S, T...) at that moment, so a test can check what ran while it was stopped.
 * Built without FAKE_CUDA_CHECKPOINT it is a driver older than the checkpoint calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_TIMEOUT 909

static int initialised = 0;

static const char *dir(void) {
    const char *d = getenv("FAKE_CUDA_DIR");
    return d ? d : "/nonexistent";
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    const char *v = getenv("FAKE_CUDA_VERSION");
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = v ? atoi(v) : 12080;
    return CUDA_SUCCESS;
}

static const char *names[][3] = {
    {"0", "CUDA_SUCCESS", "no error"},
    {"1", "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {"3", "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {"401", "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {"500", "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {"801", "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {"909", "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
};

static int lookup(CUresult error, const char **out, int which) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (atoi(names[i][0]) == error) {
            *out = names[i][which];
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **name) { return lookup(error, name, 1); }
CUresult cuGetErrorString(CUresult error, const char **text) { return lookup(error, text, 2); }

#ifdef FAKE_CUDA_CHECKPOINT
typedef enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED = 1,
    CU_PROCESS_STATE_CHECKPOINTED = 2,
    CU_PROCESS_STATE_FAILED = 3
} CUprocessState;

typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    unsigned long long reserved1[7];
} CUcheckpointLockArgs;

static const char *state_names[] = {"running", "locked", "checkpointed", "failed"};

static char proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *close = strrchr(buf, ')');
    return close && close[1] == ' ' ? close[2] : '?';
}

static void logcall(const char *op, int pid, CUresult result) {
    char path[4096];
    snprintf(path, sizeof path, "%s/calls.log", dir());
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d %c %d\n", op, pid, proc_state(pid), result);
    fclose(f);
}

static int read_state(int pid) {
    char path[4096], word[32] = {0};
    snprintf(path, sizeof path, "%s/%d", dir(), pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%31s", word);
    fclose(f);
    for (int i = 0; ok == 1 && i < 4; i++)
        if (strcmp(word, state_names[i]) == 0) return i;
    return -1;
}

static void write_state(int pid, int state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%d", dir(), pid);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%s\n", state_names[state]);
    fclose(f);
}

static int has_flag(int pid, const char *flag) {
    char path[4096], word[64];
    snprintf(path, sizeof path, "%s/%d.flags", dir(), pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int found = 0;
    while (fscanf(f, "%63s", word) == 1)
        if (strcmp(word, flag) == 0) found = 1;
    fclose(f);
    return found;
}

static CUresult step(const char *op, int pid, int from, int to, int unsupported, int busy_ms) {
    CUresult r;
    int now = read_state(pid);
    if (!initialised) r = CUDA_ERROR_NOT_INITIALIZED;
    else if (now < 0) r = CUDA_ERROR_NOT_FOUND;
    else if (now != from) r = CUDA_ERROR_ILLEGAL_STATE;
    else if (busy_ms >= 0) {
        usleep((useconds_t)busy_ms * 1000);
        r = CUDA_ERROR_TIMEOUT;
    } else if (unsupported) r = CUDA_ERROR_NOT_SUPPORTED;
    else {
        write_state(pid, to);
        r = CUDA_SUCCESS;
    }
    logcall(op, pid, r);
    return r;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    int now = read_state(pid);
    if (now < 0 || !state) return CUDA_ERROR_NOT_FOUND;
    *state = (CUprocessState)now;
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    int wait = has_flag(pid, "busy") ? (args ? (int)args->timeoutMs : 0) : -1;
    return step("lock", pid, CU_PROCESS_STATE_LOCKED - 1, CU_PROCESS_STATE_LOCKED, 0, wait);
}

CUresult cuCheckpointProcessCheckpoint(int pid, void *args) {
    (void)args;
    return step("checkpoint", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED, has_flag(pid, "uvm"), -1);
}

CUresult cuCheckpointProcessRestore(int pid, void *args) {
    (void)args;
    return step("restore", pid, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED, 0, -1);
}

CUresult cuCheckpointProcessUnlock(int pid, void *args) {
    (void)args;
    return step("unlock", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING, 0, -1);
}
#endif
