package api

// The error codes. Every error the server reports carries one (api.Error's
// Code): it names the condition precisely and is stable, so programs may
// compare it. An error with no code more precise than its class carries the
// class's name. ErrorCodes gives each code its class and meaning; it is the
// one list, and openapi.yaml's components.x-error-codes repeats it (a test
// keeps the two equal).
const (
	// Requests: the REST edge.
	CodeUnauthenticated        = "unauthenticated"
	CodeRouteNotFound          = "route_not_found"
	CodeUnsupportedContentType = "unsupported_content_type"
	CodeEmptyBody              = "empty_body"
	CodeInvalidJSON            = "invalid_json"
	CodeUnknownField           = "unknown_field"
	CodeInvalidField           = "invalid_field"
	CodeBodyTooLarge           = "body_too_large"
	CodeInvalidQuery           = "invalid_query"
	CodeInvalidPid             = "invalid_pid"
	CodeInvalidMode            = "invalid_mode"
	CodeInvalidPageToken       = "invalid_page_token"
	CodeInvalidState           = "invalid_state"
	CodeInternal               = "internal"
	CodeDeadlineExceeded       = "deadline_exceeded"

	// Sandboxes: creation and lifecycle.
	CodeSandboxNotFound        = "sandbox_not_found"
	CodeSandboxNotRunning      = "sandbox_not_running"
	CodeSandboxExists          = "sandbox_exists"
	CodeRequestIDReused        = "request_id_reused"
	CodeInvalidRequestID       = "invalid_request_id"
	CodeSandboxStateChanged    = "sandbox_state_changed"
	CodeInvalidStateTransition = "invalid_state_transition"
	CodeContention             = "contention"
	CodeRevisionMismatch       = "revision_mismatch"
	CodeInvalidSandboxID       = "invalid_sandbox_id"
	CodeSandboxIDTooLong       = "sandbox_id_too_long"
	CodeUnknownTier            = "unknown_tier"
	CodeTierUnavailable        = "tier_unavailable"
	CodeUnsupportedOnTier      = "unsupported_on_tier"
	CodeImageRequired          = "image_required"
	CodeImageAndLayers         = "image_and_layers"
	CodeImageTierMismatch      = "image_tier_mismatch"
	CodeOutOfRange             = "out_of_range"
	CodeTooManyEnv             = "too_many_env"
	CodeTooManyLabels          = "too_many_labels"
	CodeInvalidLabel           = "invalid_label"
	CodeRateLimited            = "rate_limited"
	CodeTooManySandboxes       = "too_many_sandboxes"
	CodeNoNodes                = "no_nodes"
	CodeCapacityExhausted      = "capacity_exhausted"
	CodeSandboxStartTimeout    = "sandbox_start_timeout"
	CodeSandboxStartFailed     = "sandbox_start_failed"
	CodeSandboxEnded           = "sandbox_ended"
	CodeSandboxDeleted         = "sandbox_deleted"
	CodeDestroyIncomplete      = "destroy_incomplete"
	CodeDestroyFailed          = "destroy_failed"
	CodeTierHasNoNetwork       = "tier_has_no_network"

	// Nodes.
	CodeOverloaded             = "overloaded"
	CodeNodeResourcesExhausted = "node_resources_exhausted"
	CodeNodeFull               = "node_full"
	CodeNodeBusy               = "node_busy"
	CodeNodeUnavailable        = "node_unavailable"
	CodeStoreUnavailable       = "store_unavailable"
	CodeNodeNotFound           = "node_not_found"
	CodeNodeTimeout            = "node_timeout"
	CodeBusClosed              = "bus_closed"
	CodeStreamBroken           = "stream_broken"
	CodeBadReply               = "bad_reply"
	CodeUnknownOperation       = "unknown_operation"
	CodeUploadAborted          = "upload_aborted"
	CodeFileHandleNotFound     = "file_handle_not_found"
	CodeBadOffset              = "bad_offset"
	CodeRuntimeClosed          = "runtime_closed"

	// Files, the same on every tier.
	CodeInvalidPath          = "invalid_path"
	CodePathOutsideRoot      = "path_outside_root"
	CodePathIsRoot           = "path_is_root"
	CodeNameTooLong          = "name_too_long"
	CodeSymlinkLoop          = "symlink_loop"
	CodeIsADirectory         = "is_a_directory"
	CodeNotADirectory        = "not_a_directory"
	CodeNotAFile             = "not_a_file"
	CodeInvalidFileOperation = "invalid_file_operation"
	CodeCrossDevice          = "cross_device"
	CodeFileNotFound         = "file_not_found"
	CodeParentNotDirectory   = "parent_not_directory"
	CodeParentNotFound       = "parent_not_found"
	CodeFileExists           = "file_exists"
	CodeDirectoryNotEmpty    = "directory_not_empty"
	CodeFileBusy             = "file_busy"
	CodeWorkspaceFull        = "workspace_full"
	CodeFileTooLarge         = "file_too_large"
	CodeTooManyEntries       = "too_many_entries"
	CodeReadOnly             = "read_only"
	CodeReadOnlyPath         = "read_only_path"
	CodePermissionDenied     = "permission_denied"
	CodeTooManyOpenFiles     = "too_many_open_files"
	CodeCanceled             = "canceled"
	CodeFileIOError          = "file_io_error"

	// Commands and processes.
	CodeCwdNotFound          = "cwd_not_found"
	CodeCwdNotADirectory     = "cwd_not_a_directory"
	CodeInvalidCwd           = "invalid_cwd"
	CodeInvalidCommand       = "invalid_command"
	CodeNoShell              = "no_shell"
	CodeInvalidEnv           = "invalid_env"
	CodeInvalidUser          = "invalid_user"
	CodeCommandNotFound      = "command_not_found"
	CodeCommandNotExecutable = "command_not_executable"
	CodeExecFormatError      = "exec_format_error"
	CodeArgumentsTooLarge    = "arguments_too_large"
	CodeUserNotPermitted     = "user_not_permitted"
	CodeStartFailed          = "start_failed"
	CodeTooManyProcesses     = "too_many_processes"
	CodePtyUnavailable       = "pty_unavailable"
	CodeNoResources          = "no_resources"
	CodeProcessNotFound      = "process_not_found"
	CodeProcessExited        = "process_exited"
	CodeInvalidSignal        = "invalid_signal"
	CodeSignalFailed         = "signal_failed"
	CodeInvalidSize          = "invalid_size"
	CodeNoPty                = "no_pty"
	CodeInvalidStdin         = "invalid_stdin"
	CodeStdinTooLarge        = "stdin_too_large"
	CodeStdinClosed          = "stdin_closed"
	CodeStdinTimeout         = "stdin_timeout"
	CodeStdinFailed          = "stdin_failed"

	// Phases.
	CodeNoPhases                = "no_phases"
	CodeUnknownPhase            = "unknown_phase"
	CodePhaseBackwards          = "phase_backwards"
	CodeInvalidPhase            = "invalid_phase"
	CodeTooManyPhases           = "too_many_phases"
	CodeNetworkAndPhases        = "network_and_phases"
	CodePhaseWritablePath       = "phase_writable_path"
	CodeInvalidExecutable       = "invalid_executable"
	CodeInvalidCapability       = "invalid_capability"
	CodeCapabilityNotInSandbox  = "capability_not_in_sandbox"
	CodeExecutableNotAllowed    = "executable_not_allowed"
	CodeExecutablesUnenforced   = "executables_unenforced"
	CodeTierHasNoPhases         = "tier_has_no_phases"
	CodeTierHasNoUsers          = "tier_has_no_users"
	CodeTierHasNoCapabilities   = "tier_has_no_capabilities"
	CodePhaseLimitsUnsupported  = "phase_limits_unsupported"
	CodePhaseUnsupported        = "phase_unsupported"
	CodePhaseChangeFailed       = "phase_change_failed"
	CodePhaseChangeBusy         = "phase_change_busy"
	CodePhaseNetworkUnavailable = "phase_network_unavailable"
	CodePhaseKillFailed         = "phase_kill_failed"
	CodePhaseNoRootFailed       = "phase_noroot_failed"
	CodePhaseWritableFailed     = "phase_writable_failed"

	// Grading.
	CodeInvalidGrade         = "invalid_grade"
	CodeUnsupportedFormat    = "unsupported_format"
	CodeGradingSandbox       = "grading_sandbox"
	CodeGradingNeedsLayers   = "grading_needs_layers"
	CodeTestsLayerSeen       = "tests_layer_seen"
	CodeInvalidDeclaredTests = "invalid_declared_tests"
	CodeStateTooLarge        = "state_too_large"

	// The in-sandbox agent.
	CodeAgentGone             = "agent_gone"
	CodeAgentUnreachable      = "agent_unreachable"
	CodeAgentProtocolError    = "agent_protocol_error"
	CodeAgentProtocolMismatch = "agent_protocol_mismatch"
	CodeAgentTimeout          = "agent_timeout"
	CodeAgentPanic            = "agent_panic"
	CodeNoReply               = "no_reply"
	CodeBadRequest            = "bad_request"
	CodeUnknownOp             = "unknown_op"
	CodeRequestTooLarge       = "request_too_large"
	CodeReplyTooLarge         = "reply_too_large"
	CodeEventTooLarge         = "event_too_large"
	CodeTooManyCalls          = "too_many_calls"
	CodeTooManyConnections    = "too_many_connections"
	CodePeerInSandbox         = "peer_in_sandbox"
	CodePeerUnknown           = "peer_unknown"
	CodeNoListener            = "no_listener"
	CodeBadRoot               = "bad_root"
	CodeBadCgroup             = "bad_cgroup"

	// The container tier.
	CodeImageNeedsLayers  = "image_needs_layers"
	CodeImageLacksGuest   = "image_lacks_guest"
	CodeNoNamespaceOwner  = "no_namespace_owner"
	CodePathNotSearchable = "path_not_searchable"

	// The VM tiers.
	CodeImageWithoutLayers     = "image_without_layers"
	CodeImageKernelInvalid     = "image_kernel_invalid"
	CodeGuestKernelUnavailable = "guest_kernel_unavailable"
	CodeNoVMUID                = "no_vm_uid"
	CodeNetworkSetupFailed     = "network_setup_failed"
	CodeMkfsMissing            = "mkfs_missing"
	CodeVMConfigInvalid        = "vm_config_invalid"
	CodeVMStartFailed          = "vm_start_failed"
	CodeVMRunDirBusy           = "vm_rundir_busy"
	CodeVMNotFound             = "vm_not_found"
	CodeVMAdoptMismatch        = "vm_adopt_mismatch"
	CodeVMGone                 = "vm_gone"
	CodeVMKillFailed           = "vm_kill_failed"
	CodeBootTimeout            = "boot_timeout"
	CodeBootFailed             = "boot_failed"

	// The function tier.
	CodeInvalidModule  = "invalid_module"
	CodeNotACommand    = "not_a_command"
	CodeMemoryLimit    = "memory_limit"
	CodeModuleTooLarge = "module_too_large"
	CodeModuleLimit    = "module_limit"
	CodeToolNotFound   = "tool_not_found"

	// Images and layers.
	CodeImageNotFound           = "image_not_found"
	CodeImageExists             = "image_exists"
	CodeImageInUse              = "image_in_use"
	CodeInvalidName             = "invalid_name"
	CodeInvalidImage            = "invalid_image"
	CodeImageSourceUnsupported  = "image_source_unsupported"
	CodeImageMissingOnNode      = "image_missing_on_node"
	CodeImageNotLayer           = "image_not_layer"
	CodeInvalidLayers           = "invalid_layers"
	CodeNoLayers                = "no_layers"
	CodeTooManyLayers           = "too_many_layers"
	CodeInvalidRole             = "invalid_role"
	CodeDirImagesDisabled       = "dir_images_disabled"
	CodeDirectoryNotFound       = "directory_not_found"
	CodeNoBlobStore             = "no_blob_store"
	CodeNoLayerCache            = "no_layer_cache"
	CodeLayerNotFound           = "layer_not_found"
	CodeLayerExists             = "layer_exists"
	CodeLayerInUse              = "layer_in_use"
	CodeLayerTooLarge           = "layer_too_large"
	CodeLayerMetaTooLarge       = "layer_meta_too_large"
	CodeInvalidLayer            = "invalid_layer"
	CodeInvalidKind             = "invalid_kind"
	CodeArchiveTooLarge         = "archive_too_large"
	CodeLayerManifest           = "layer_manifest"
	CodeLayerOutDir             = "layer_out_dir"
	CodeLayerOutDirNotEmpty     = "layer_out_dir_not_empty"
	CodeLayerSourceNotFound     = "layer_source_not_found"
	CodeLayerSourceNotDirectory = "layer_source_not_directory"
	CodeDeviceNode              = "device_node"
	CodeSpecialFile             = "special_file"
	CodeLayerBadMetadata        = "layer_bad_metadata"
	CodeLayerDigestMismatch     = "layer_digest_mismatch"
	CodeLayerChunks             = "layer_chunks"
	CodeLayerBadSuperblock      = "layer_bad_superblock"
	CodeLayerDevices            = "layer_devices"
	CodeLayerFsck               = "layer_fsck"
	CodeLayerCorrupt            = "layer_corrupt"
	CodeLayerCacheFull          = "layer_cache_full"
	CodeLayerCacheClosed        = "layer_cache_closed"
	CodeInvalidOptions          = "invalid_options"
	CodeLayerIDMismatch         = "layer_id_mismatch"
	CodeDuplicateLayer          = "duplicate_layer"
	CodeLayerMountFailed        = "layer_mount_failed"
	CodeLayerIDMapFailed        = "layer_idmap_failed"
	CodeViewMountFailed         = "view_mount_failed"
	CodeInvalidUpper            = "invalid_upper"
	CodeRootExists              = "root_exists"
	CodeRootMismatch            = "root_mismatch"
	CodeRootMountFailed         = "root_mount_failed"
	CodeOCIUnknownFormat        = "oci_unknown_format"
	CodeOCINotFound             = "oci_not_found"
	CodeOCIPlatform             = "oci_platform"
	CodeOCIPlatformNotFound     = "oci_platform_not_found"
	CodeOCIMultipleImages       = "oci_multiple_images"
	CodeOCIIndex                = "oci_index"
	CodeOCIIndexTooLarge        = "oci_index_too_large"
	CodeOCIManifest             = "oci_manifest"
	CodeOCIManifestTooLarge     = "oci_manifest_too_large"
	CodeOCIConfig               = "oci_config"
	CodeOCIDigestMismatch       = "oci_digest_mismatch"
	CodeOCIDiffIDMismatch       = "oci_diff_id_mismatch"
	CodeOCILayerUnreadable      = "oci_layer_unreadable"
	CodeTarTooLarge             = "tar_too_large"
	CodeTarTooManyEntries       = "tar_too_many_entries"
	CodeTarDuplicate            = "tar_duplicate"
	CodeTarHeaderTooLarge       = "tar_header_too_large"
	CodeTarTruncated            = "tar_truncated"
	CodeTarMalformed            = "tar_malformed"
	CodeTarUnsafePath           = "tar_unsafe_path"
	CodeTarNameTooLong          = "tar_name_too_long"
	CodeTarHardlink             = "tar_hardlink"
	CodeTarDevice               = "tar_device"
	CodeTarUnsupportedType      = "tar_unsupported_type"
	CodeTarPathConflict         = "tar_path_conflict"
	CodeTarXattr                = "tar_xattr"
	CodeBlobNotFound            = "blob_not_found"
	CodeInvalidDigest           = "invalid_digest"
	CodeDigestMismatch          = "digest_mismatch"
	CodeInvalidRange            = "invalid_range"
	CodeInvalidChunkIndex       = "invalid_chunk_index"
	CodeChunkCorrupt            = "chunk_corrupt"
	CodeChunkFetchTimeout       = "chunk_fetch_timeout"
	CodeLazyBlobExists          = "lazy_blob_exists"
	CodeLazyCacheLocked         = "lazy_cache_locked"
	CodeLazyBlobsClosed         = "lazy_blobs_closed"

	// Trajectories: the log of a rollout, resume, snapshots and forks.
	CodeInvalidTrajectoryID = "invalid_trajectory_id"
	CodeTrajectoryNotFound  = "trajectory_not_found"
	CodeTrajectoryExists    = "trajectory_exists"
	CodeTrajectoryFull      = "trajectory_full"
	CodeTrajectoryChanged   = "trajectory_changed"
	CodeTrajectoryRunning   = "trajectory_running"
	CodeTrajectoryInFlight  = "trajectory_in_flight"
	CodeInvalidForkCount    = "invalid_fork_count"
	CodeSnapshotNotFound    = "snapshot_not_found"
	CodeSecretEnvMissing    = "secret_env_missing"
	CodeInvalidOnDivergence = "invalid_on_divergence"
	CodeReplayDiverged      = "replay_diverged"
	CodeNoTrajectoryStore   = "no_trajectory_store"
	// Snapshots of a microVM: its agent freezes and streams its upper.
	CodeStateFreezeFailed  = "state_freeze_failed"
	CodeStateFreezeExpired = "state_freeze_expired"
	CodeStateInvalid       = "state_invalid"
	CodeSnapshotTooLarge   = "snapshot_too_large"

	// Networks.
	CodeInvalidNetworkPolicy  = "invalid_network_policy"
	CodeInvalidNetworkOptions = "invalid_network_options"
	CodeNetworkHostUnresolved = "network_host_unresolved"
	CodeNetworkNotFound       = "network_not_found"
	CodeNetworkExists         = "network_exists"
	CodeNetworkBusy           = "network_busy"
	CodeNetworkRangeExhausted = "network_range_exhausted"
	CodeNetworkManagerRunning = "network_manager_running"
	CodeNetworkClosed         = "network_closed"

	// Cgroups.
	CodeInvalidCgroupParent = "invalid_cgroup_parent"
	CodeInvalidCgroupID     = "invalid_cgroup_id"
	CodeInvalidLimits       = "invalid_limits"
	CodeCgroupsClosed       = "cgroups_closed"
)

// The error classes, as api.Error's Class carries them. A class decides
// the HTTP status of a response.
const (
	ClassInvalid          = "invalid_argument"  // 400
	ClassUnauthenticated  = "unauthenticated"   // 401
	ClassPermissionDenied = "permission_denied" // 403
	ClassNotFound         = "not_found"         // 404
	ClassConflict         = "conflict"          // 409
	ClassTooLarge         = "too_large"         // 413
	ClassUnsupported      = "unsupported"       // 422
	ClassRateLimited      = "rate_limited"      // 429
	ClassUnavailable      = "unavailable"       // 503
	ClassDeadlineExceeded = "deadline_exceeded" // 504
	ClassInternal         = "internal"          // 500
)

// ErrorCode describes one error code.
type ErrorCode struct {
	Code string
	// Class is the class every error of this code has.
	Class string
	// Doc says, in a line, what the code means.
	Doc string
}

// ErrorCodes lists every error code the server reports, with its class
// and meaning.
var ErrorCodes = []ErrorCode{
	// Requests: the REST edge.
	{CodeUnauthenticated, ClassUnauthenticated, "the bearer token is missing or wrong"},
	{CodeRouteNotFound, ClassNotFound, "no route for the method and path"},
	{CodeUnsupportedContentType, ClassInvalid, "a JSON body's content type is not application/json"},
	{CodeEmptyBody, ClassInvalid, "the request needs a JSON body and has none"},
	{CodeInvalidJSON, ClassInvalid, "the body is not one JSON object of the expected shape"},
	{CodeUnknownField, ClassInvalid, "the body has a field the request does not know"},
	{CodeInvalidField, ClassInvalid, "a field of the body has the wrong type"},
	{CodeBodyTooLarge, ClassTooLarge, "the body is larger than the server accepts"},
	{CodeInvalidQuery, ClassInvalid, "a query parameter is not valid, e.g. a flag that is not true or false"},
	{CodeInvalidPid, ClassInvalid, "a pid in the path is not a positive integer"},
	{CodeInvalidMode, ClassInvalid, "a file mode is not octal permission bits such as 0644"},
	{CodeInvalidPageToken, ClassInvalid, "a list's page_token is not one the server gave"},
	{CodeInvalidState, ClassInvalid, "a list's state filter names no sandbox state"},
	{CodeInternal, ClassInternal, "the server failed; the detail is in its log"},
	{CodeDeadlineExceeded, ClassDeadlineExceeded, "the call to the sandbox's agent ran out of time"},

	// Sandboxes: creation and lifecycle.
	{CodeSandboxNotFound, ClassNotFound, "no sandbox by that ID"},
	{CodeSandboxNotRunning, ClassConflict, "the sandbox has ended (killed or expired) but the server still knows it"},
	{CodeSandboxExists, ClassConflict, "a sandbox by that ID exists already"},
	{CodeNodeNotFound, ClassNotFound, "no node by that ID has reported in"},
	{CodeRequestIDReused, ClassConflict, "a create's request_id (Idempotency-Key) was used for another request"},
	{CodeInvalidRequestID, ClassInvalid, "a create's request_id (Idempotency-Key) is not 1–128 letters, digits and -_.:/"},
	{CodeSandboxStateChanged, ClassConflict, "the sandbox changed state during the request"},
	{CodeInvalidStateTransition, ClassConflict, "the sandbox cannot go from its state to the one asked"},
	{CodeContention, ClassUnavailable, "the sandbox's record changed too often during the request; retry"},
	{CodeRevisionMismatch, ClassConflict, "a stored record changed concurrently"},
	{CodeInvalidSandboxID, ClassInvalid, "a sandbox ID is not valid"},
	{CodeSandboxIDTooLong, ClassInvalid, "a sandbox ID is too long for the node's state directory"},
	{CodeUnknownTier, ClassInvalid, "the tier is not function, container, microvm or vm"},
	{CodeTierUnavailable, ClassUnsupported, "no connected node runs the tier"},
	{CodeUnsupportedOnTier, ClassUnsupported, "the operation is not supported on the sandbox's tier"},
	{CodeImageRequired, ClassInvalid, "the tier has no default image: a create must name one"},
	{CodeImageAndLayers, ClassInvalid, "a create names both an image and layers"},
	{CodeImageTierMismatch, ClassInvalid, "the image is not for the sandbox's tier"},
	{CodeOutOfRange, ClassInvalid, "a number (cpu, memory, timeout, size) is outside its range"},
	{CodeTooManyEnv, ClassInvalid, "more environment variables than a create allows"},
	{CodeTooManyLabels, ClassInvalid, "more labels than a create allows"},
	{CodeInvalidLabel, ClassInvalid, "a label's key or value is not valid"},
	{CodeRateLimited, ClassRateLimited, "this token creates sandboxes too fast; retry after Retry-After"},
	{CodeTooManySandboxes, ClassRateLimited, "this token has its maximum of live sandboxes; delete some first (a retry does not help)"},
	{CodeNoNodes, ClassUnavailable, "no node is connected"},
	{CodeStoreUnavailable, ClassUnavailable, "the control plane's store (NATS JetStream) does not answer: no quorum, or no connection; retry after Retry-After"},
	{CodeCapacityExhausted, ClassUnavailable, "every node that runs the tier is full"},
	{CodeSandboxStartTimeout, ClassUnavailable, "the sandbox was not ready by its start deadline on a busy node; nothing was kept"},
	{CodeSandboxStartFailed, ClassInternal, "the sandbox did not start"},
	{CodeSandboxEnded, ClassUnavailable, "the sandbox ended while it was being created"},
	{CodeSandboxDeleted, ClassConflict, "the sandbox was deleted while it was being created"},
	{CodeDestroyIncomplete, ClassUnavailable, "not every process of the sandbox could be killed yet; destroying it again will finish"},
	{CodeDestroyFailed, ClassInternal, "the sandbox was destroyed but not fully removed from the node"},
	{CodeTierHasNoNetwork, ClassUnsupported, "the function tier has no network: egress needs another tier"},

	// Nodes.
	{CodeOverloaded, ClassRateLimited, "the node starts as many sandboxes as it can and its queue is full; nothing was created"},
	{CodeNodeResourcesExhausted, ClassUnavailable, "the node ran short of resources to start the sandbox; nothing was created"},
	{CodeNodeFull, ClassUnavailable, "the node runs its maximum of sandboxes"},
	{CodeNodeBusy, ClassUnavailable, "the node is handling too many requests"},
	{CodeNodeUnavailable, ClassUnavailable, "the node is not reachable"},
	{CodeNodeTimeout, ClassDeadlineExceeded, "the node did not answer in time"},
	{CodeBusClosed, ClassUnavailable, "the control plane is shutting down"},
	{CodeStreamBroken, ClassUnavailable, "a node's output arrived out of order"},
	{CodeBadReply, ClassInternal, "a node answered with a message of the wrong kind"},
	{CodeUnknownOperation, ClassUnsupported, "the node does not know the operation (an older node)"},
	{CodeUploadAborted, ClassUnavailable, "an upload to the node ended before its last chunk"},
	{CodeFileHandleNotFound, ClassNotFound, "a node's handle of a file transfer expired or is unknown"},
	{CodeBadOffset, ClassInvalid, "a chunk of a file transfer is not at the offset expected"},
	{CodeRuntimeClosed, ClassUnavailable, "the tier's runtime on the node is shutting down"},

	// Files, the same on every tier.
	{CodeInvalidPath, ClassInvalid, "the path is empty, longer than 4096 bytes or holds a NUL byte"},
	{CodePathOutsideRoot, ClassInvalid, "the path uses .., or a symlink on it leads out of the tier's file root"},
	{CodePathIsRoot, ClassInvalid, "the file root itself cannot be removed or replaced"},
	{CodeNameTooLong, ClassInvalid, "a name in the path is longer than 255 bytes (ENAMETOOLONG)"},
	{CodeSymlinkLoop, ClassInvalid, "too many symbolic links on the path (ELOOP)"},
	{CodeIsADirectory, ClassInvalid, "reading or writing a directory as a file (EISDIR)"},
	{CodeNotADirectory, ClassInvalid, "listing something that is not a directory"},
	{CodeNotAFile, ClassInvalid, "reading a FIFO, socket or device: only regular files are read, and they are refused before they are opened (ENXIO, ENODEV)"},
	{CodeInvalidFileOperation, ClassInvalid, "the operation is not valid there, e.g. a directory moved into itself (EINVAL)"},
	{CodeCrossDevice, ClassInvalid, "a rename across file systems (EXDEV)"},
	{CodeFileNotFound, ClassNotFound, "the file does not exist (ENOENT)"},
	{CodeParentNotDirectory, ClassNotFound, "a file stands where the path needs a directory (ENOTDIR)"},
	{CodeParentNotFound, ClassNotFound, "a write's directory is missing; write with parents=true to create it"},
	{CodeFileExists, ClassConflict, "the file already exists (EEXIST)"},
	{CodeDirectoryNotEmpty, ClassConflict, "a non-recursive remove of a directory that is not empty (ENOTEMPTY)"},
	{CodeFileBusy, ClassConflict, "the file is a mount point or in use (EBUSY, ETXTBSY)"},
	{CodeWorkspaceFull, ClassTooLarge, "the sandbox's disk is full (ENOSPC, EDQUOT)"},
	{CodeFileTooLarge, ClassTooLarge, "an upload past the server's or the request's limit, or past the file system's (EFBIG)"},
	{CodeTooManyEntries, ClassTooLarge, "a listing of more than 65,536 entries; list less deep"},
	{CodeReadOnly, ClassPermissionDenied, "the file is on a read-only file system, e.g. a path a phase does not list as writable (EROFS)"},
	{CodeReadOnlyPath, ClassPermissionDenied, "the function tier's phase does not let this path be written"},
	{CodePermissionDenied, ClassPermissionDenied, "the file's permissions refuse the operation (EACCES, EPERM)"},
	{CodeTooManyOpenFiles, ClassUnavailable, "the sandbox has too many open files; try again (EMFILE, ENFILE)"},
	{CodeCanceled, ClassUnavailable, "the request or the sandbox ended during the operation"},
	{CodeFileIOError, ClassInternal, "an input/output error (EIO), or an errno the files API does not list; the message has the errno's text"},

	// Commands and processes.
	{CodeCwdNotFound, ClassNotFound, "a command's cwd does not exist"},
	{CodeCwdNotADirectory, ClassInvalid, "a command's cwd is not a directory"},
	{CodeInvalidCwd, ClassInvalid, "a command's cwd holds a NUL byte or .. (function tier), or cannot be used"},
	{CodeInvalidCommand, ClassInvalid, "the command is empty or not valid"},
	{CodeNoShell, ClassUnsupported, "the tier has no shell: pass argv, or a command line without shell syntax"},
	{CodeInvalidEnv, ClassInvalid, "an environment variable is not NAME=value without NUL bytes"},
	{CodeInvalidUser, ClassInvalid, "a user is not root, uid or uid:gid"},
	{CodeCommandNotFound, ClassNotFound, "the command's program does not exist"},
	{CodeCommandNotExecutable, ClassPermissionDenied, "the command's program is not executable"},
	{CodeExecFormatError, ClassInvalid, "the command's program is not one the sandbox can run"},
	{CodeArgumentsTooLarge, ClassTooLarge, "the command's arguments and environment are too large"},
	{CodeUserNotPermitted, ClassPermissionDenied, "the command cannot run as the requested user"},
	{CodeStartFailed, ClassInternal, "the command did not start"},
	{CodeTooManyProcesses, ClassRateLimited, "the sandbox's agent tracks its maximum of processes"},
	{CodePtyUnavailable, ClassUnavailable, "no pseudo-terminal is available"},
	{CodeNoResources, ClassUnavailable, "the sandbox ran short of pipes or other resources to start the command"},
	{CodeProcessNotFound, ClassNotFound, "no process by that pid"},
	{CodeProcessExited, ClassConflict, "the process has exited"},
	{CodeInvalidSignal, ClassInvalid, "the signal is not one a process can be sent"},
	{CodeSignalFailed, ClassInternal, "the signal could not be sent"},
	{CodeInvalidSize, ClassInvalid, "a terminal size is not valid"},
	{CodeNoPty, ClassInvalid, "the process has no terminal"},
	{CodeInvalidStdin, ClassInvalid, "a background process takes its standard input through its stdin call, not a reader"},
	{CodeStdinTooLarge, ClassTooLarge, "a background process's initial standard input is larger than allowed"},
	{CodeStdinClosed, ClassConflict, "the process's standard input is closed"},
	{CodeStdinTimeout, ClassDeadlineExceeded, "the process did not read its standard input in time"},
	{CodeStdinFailed, ClassInternal, "writing to the process's standard input failed"},

	// Phases.
	{CodeNoPhases, ClassConflict, "the sandbox was created without phases"},
	{CodeUnknownPhase, ClassInvalid, "the sandbox has no phase by that name"},
	{CodePhaseBackwards, ClassConflict, "going back to an earlier phase needs back=true"},
	{CodeInvalidPhase, ClassInvalid, "a phase is not valid: its name, or a field the message names"},
	{CodeTooManyPhases, ClassInvalid, "more phases than a sandbox allows"},
	{CodeNetworkAndPhases, ClassInvalid, "with phases, each phase has its own network: the sandbox's must be left out"},
	{CodePhaseWritablePath, ClassInvalid, "a phase's writable path is not valid"},
	{CodeInvalidExecutable, ClassInvalid, "a phase's executables entry is not an absolute file, dir/* or dir/**; the message says which and why"},
	{CodeInvalidCapability, ClassInvalid, "a capability cannot be granted"},
	{CodeCapabilityNotInSandbox, ClassInvalid, "a phase grants a capability the sandbox does not have"},
	{CodeExecutableNotAllowed, ClassPermissionDenied, "the phase does not allow running the program"},
	{CodeExecutablesUnenforced, ClassUnsupported, "the phase names its executables, and the node cannot enforce them"},
	{CodeTierHasNoPhases, ClassUnsupported, "the tier has no phases"},
	{CodeTierHasNoUsers, ClassUnsupported, "the function tier has no users"},
	{CodeTierHasNoCapabilities, ClassUnsupported, "the function tier has no capabilities"},
	{CodePhaseLimitsUnsupported, ClassUnsupported, "a microVM's cpu and memory are fixed at boot: a phase cannot change them"},
	{CodePhaseUnsupported, ClassUnsupported, "this agent does not apply phases: its host does"},
	{CodePhaseChangeFailed, ClassInternal, "the sandbox could not move to the phase; it has failed"},
	{CodePhaseChangeBusy, ClassUnavailable, "the earlier phase's processes did not stop in time; the sandbox stays in that phase"},
	{CodePhaseNetworkUnavailable, ClassInternal, "a phase has a network and the sandbox was made without one"},
	{CodePhaseKillFailed, ClassInternal, "the earlier phase's processes could not be ended"},
	{CodePhaseNoRootFailed, ClassInternal, "root's capabilities could not be restricted"},
	{CodePhaseWritableFailed, ClassInternal, "the phase's writable paths could not be applied"},

	// Grading.
	{CodeInvalidGrade, ClassInvalid, "a grade request is not valid"},
	{CodeUnsupportedFormat, ClassUnsupported, "the report format is not junit"},
	{CodeGradingSandbox, ClassConflict, "the sandbox is itself a grading"},
	{CodeGradingNeedsLayers, ClassUnsupported, "sealed grading needs a sandbox of a layered image"},
	{CodeTestsLayerSeen, ClassInvalid, "the sandbox already had the tests layer: the tests must come from a layer it never had"},
	{CodeInvalidDeclaredTests, ClassInvalid, "the tests layer declares its tests wrongly"},
	{CodeStateTooLarge, ClassTooLarge, "more files or bytes to carry into the grading than allowed"},

	// The in-sandbox agent.
	{CodeAgentGone, ClassUnavailable, "the connection to the sandbox's agent is closed"},
	{CodeAgentUnreachable, ClassUnavailable, "the sandbox's agent could not be reached again"},
	{CodeAgentProtocolError, ClassUnavailable, "the sandbox's agent broke the protocol"},
	{CodeAgentProtocolMismatch, ClassUnsupported, "the sandbox's agent speaks another protocol version than the node"},
	{CodeAgentTimeout, ClassDeadlineExceeded, "the sandbox's agent sent nothing for too long"},
	{CodeAgentPanic, ClassInternal, "the agent failed serving the call"},
	{CodeNoReply, ClassInternal, "the agent did not answer the call"},
	{CodeBadRequest, ClassInvalid, "the agent could not decode the call's arguments"},
	{CodeUnknownOp, ClassUnsupported, "the agent has no such operation"},
	{CodeRequestTooLarge, ClassTooLarge, "a call to the agent is larger than allowed"},
	{CodeReplyTooLarge, ClassTooLarge, "the agent's reply is larger than allowed"},
	{CodeEventTooLarge, ClassInternal, "an event of the agent is larger than allowed"},
	{CodeTooManyCalls, ClassRateLimited, "more calls at once on one connection to the agent than allowed"},
	{CodeTooManyConnections, ClassRateLimited, "the agent has its maximum of connections"},
	{CodePeerInSandbox, ClassPermissionDenied, "the agent refuses a connection from inside the sandbox"},
	{CodePeerUnknown, ClassPermissionDenied, "the agent cannot tell who connected"},
	{CodeNoListener, ClassInvalid, "the agent was started without a listener"},
	{CodeBadRoot, ClassInvalid, "the agent cannot open its file root"},
	{CodeBadCgroup, ClassInvalid, "the agent cannot open the commands' cgroup"},

	// The container tier.
	{CodeImageNeedsLayers, ClassInvalid, "the container tier runs layered images, and the image has no layers"},
	{CodeImageLacksGuest, ClassInvalid, "an image for the container tier none of whose layers has the agent, on a server without a toolkit/dsec-guest layer to add"},
	{CodeNoNamespaceOwner, ClassUnavailable, "every owner id of the node's user namespaces is in use"},
	{CodePathNotSearchable, ClassUnavailable, "a directory on the way to the node's state denies search to the sandboxes"},

	// The VM tiers.
	{CodeImageWithoutLayers, ClassInvalid, "the VM tiers run images built from layers, and the image has none"},
	{CodeImageKernelInvalid, ClassInvalid, "the kernel the image brings is not usable"},
	{CodeGuestKernelUnavailable, ClassUnavailable, "the guest kernel or agent could not be got"},
	{CodeNoVMUID, ClassUnavailable, "every QEMU uid of the tier is in use"},
	{CodeNetworkSetupFailed, ClassInternal, "the VM could not be plugged into its network"},
	{CodeMkfsMissing, ClassUnavailable, "the VM's upper disk needs mkfs.ext4 (Debian: e2fsprogs)"},
	{CodeVMConfigInvalid, ClassInvalid, "a VM's configuration is not valid"},
	{CodeVMStartFailed, ClassUnavailable, "QEMU did not start or its QMP did not answer"},
	{CodeVMRunDirBusy, ClassConflict, "the VM's run directory holds another VM's sockets"},
	{CodeVMNotFound, ClassNotFound, "the VM's QEMU process is gone (adopting it after a restart)"},
	{CodeVMAdoptMismatch, ClassConflict, "the pid is not that VM's QEMU (adopting it after a restart)"},
	{CodeVMGone, ClassNotFound, "the VM's QEMU process has exited"},
	{CodeVMKillFailed, ClassInternal, "QEMU survived SIGKILL for too long"},
	{CodeBootTimeout, ClassDeadlineExceeded, "the guest was not ready in time"},
	{CodeBootFailed, ClassUnavailable, "the guest exited or its readiness check failed"},

	// The function tier.
	{CodeInvalidModule, ClassInvalid, "the WebAssembly module cannot be compiled or instantiated"},
	{CodeNotACommand, ClassInvalid, "the module is not a WASI command: it exports no _start"},
	{CodeMemoryLimit, ClassTooLarge, "the module needs more memory than the sandbox allows before it runs"},
	{CodeModuleTooLarge, ClassTooLarge, "the module is larger than the function tier runs"},
	{CodeModuleLimit, ClassTooLarge, "the module's declarations exceed the function tier's limits"},
	{CodeToolNotFound, ClassNotFound, "the image has no tool by that name"},

	// Images and layers.
	{CodeImageNotFound, ClassNotFound, "no image by that name or ID"},
	{CodeImageExists, ClassConflict, "an image by that ID exists already"},
	{CodeImageInUse, ClassConflict, "a live sandbox uses the image"},
	{CodeInvalidName, ClassInvalid, "a name is not lower-case name[/path][:tag]"},
	{CodeInvalidImage, ClassInvalid, "an image record is not valid, e.g. a directory that is not absolute"},
	{CodeImageSourceUnsupported, ClassUnsupported, "the node cannot load images of that source"},
	{CodeImageMissingOnNode, ClassNotFound, "the image's directory is missing on the node"},
	{CodeImageNotLayer, ClassInvalid, "an image named where a layer is wanted (only a base may be an image)"},
	{CodeInvalidLayers, ClassInvalid, "an image names layers and base, workspace or toolkit at once"},
	{CodeNoLayers, ClassInvalid, "an image needs at least one layer"},
	{CodeTooManyLayers, ClassInvalid, "an image has more layers than allowed"},
	{CodeInvalidRole, ClassInvalid, "a layer of an image needs a role (base, workspace, toolkit, …)"},
	{CodeDirImagesDisabled, ClassPermissionDenied, "directory images and layers are disabled on this server"},
	{CodeDirectoryNotFound, ClassNotFound, "a directory image's directory does not exist on the server"},
	{CodeNoBlobStore, ClassUnsupported, "this server has no layer store"},
	{CodeNoLayerCache, ClassUnsupported, "the node has no layer cache"},
	{CodeLayerNotFound, ClassNotFound, "no layer by that name or ID (nor, for a base, an image)"},
	{CodeLayerExists, ClassConflict, "a layer by that ID exists already"},
	{CodeLayerInUse, ClassConflict, "an image uses the layer; remove the image first"},
	{CodeLayerTooLarge, ClassTooLarge, "a layer upload is larger than the server accepts"},
	{CodeLayerMetaTooLarge, ClassTooLarge, "a layer's metadata image is larger than allowed"},
	{CodeInvalidLayer, ClassInvalid, "the built or uploaded layer is not valid"},
	{CodeInvalidKind, ClassInvalid, "a layer build's kind is not tar or oci"},
	{CodeArchiveTooLarge, ClassTooLarge, "the archive is larger than the server accepts"},
	{CodeLayerManifest, ClassInvalid, "a layer's manifest is not valid"},
	{CodeLayerOutDir, ClassInvalid, "a layer build's output directory is missing or lies inside its source"},
	{CodeLayerOutDirNotEmpty, ClassConflict, "a layer build's output directory is not empty"},
	{CodeLayerSourceNotFound, ClassNotFound, "a layer build's source directory does not exist"},
	{CodeLayerSourceNotDirectory, ClassInvalid, "a layer build's source is not a directory"},
	{CodeDeviceNode, ClassInvalid, "the layer's source holds a device node; layers cannot hold them"},
	{CodeSpecialFile, ClassInvalid, "the layer's source holds a FIFO or socket; layers cannot hold them"},
	{CodeLayerBadMetadata, ClassInvalid, "the layer's metadata image cannot be read"},
	{CodeLayerDigestMismatch, ClassInvalid, "a layer file's digest or size is not the manifest's"},
	{CodeLayerChunks, ClassInvalid, "a layer's chunk index is malformed or does not index its data blob"},
	{CodeLayerBadSuperblock, ClassInvalid, "the layer's EROFS superblock cannot be read"},
	{CodeLayerDevices, ClassInvalid, "the layer's EROFS image has other than one extra device"},
	{CodeLayerFsck, ClassInvalid, "fsck.erofs rejects the layer"},
	{CodeLayerCorrupt, ClassInternal, "a layer in the store does not match its digest or size"},
	{CodeLayerCacheFull, ClassUnavailable, "the node's layer cache has no space left"},
	{CodeLayerCacheClosed, ClassUnavailable, "the node's layer cache is closed"},
	{CodeInvalidOptions, ClassInvalid, "the options of the node's layer cache or on-demand blob server are not valid"},
	{CodeLayerIDMismatch, ClassInvalid, "a layer's manifest is another layer's"},
	{CodeDuplicateLayer, ClassInvalid, "a layer appears twice in a stack"},
	{CodeLayerMountFailed, ClassInternal, "a layer could not be mounted"},
	{CodeLayerIDMapFailed, ClassInternal, "a layer could not be id-mapped"},
	{CodeViewMountFailed, ClassInternal, "a stack of layers could not be mounted"},
	{CodeInvalidUpper, ClassInvalid, "a root's upper directory is not an absolute path without ',' or ':'"},
	{CodeRootExists, ClassConflict, "the sandbox already has a root"},
	{CodeRootMismatch, ClassConflict, "the sandbox's root is over other layers or another upper directory"},
	{CodeRootMountFailed, ClassInternal, "the sandbox's root could not be mounted or detached"},
	{CodeOCIUnknownFormat, ClassInvalid, "the source is neither an OCI image layout nor a `docker save` archive"},
	{CodeOCINotFound, ClassNotFound, "the OCI image is not in the source"},
	{CodeOCIPlatform, ClassInvalid, "a platform is not os/arch[/variant]"},
	{CodeOCIPlatformNotFound, ClassNotFound, "the image has no manifest for the platform"},
	{CodeOCIMultipleImages, ClassInvalid, "the archive holds other than exactly one image"},
	{CodeOCIIndex, ClassInvalid, "the OCI image index is not valid"},
	{CodeOCIIndexTooLarge, ClassTooLarge, "the OCI image index is larger than allowed"},
	{CodeOCIManifest, ClassInvalid, "an image manifest is not valid"},
	{CodeOCIManifestTooLarge, ClassTooLarge, "an image manifest is larger than allowed"},
	{CodeOCIConfig, ClassInvalid, "the image config is not valid"},
	{CodeOCIDigestMismatch, ClassInvalid, "the image config does not match its digest"},
	{CodeOCIDiffIDMismatch, ClassInvalid, "a layer's digest is not the one the image config names"},
	{CodeOCILayerUnreadable, ClassInvalid, "a layer of the image cannot be read"},
	{CodeTarTooLarge, ClassTooLarge, "the archive is larger than allowed"},
	{CodeTarTooManyEntries, ClassTooLarge, "the archive has more entries than allowed"},
	{CodeTarDuplicate, ClassInvalid, "the archive holds an entry twice"},
	{CodeTarHeaderTooLarge, ClassInvalid, "an archive header or PAX record is larger than 1 MiB"},
	{CodeTarTruncated, ClassInvalid, "the archive is truncated"},
	{CodeTarMalformed, ClassInvalid, "the archive is not a valid tar stream"},
	{CodeTarUnsafePath, ClassInvalid, "an archive entry's path leads out of the layer or through a symlink"},
	{CodeTarNameTooLong, ClassInvalid, "an archive entry's name is longer than 4096 bytes"},
	{CodeTarHardlink, ClassInvalid, "an archive hard link points at anything but an earlier regular file"},
	{CodeTarDevice, ClassInvalid, "an archive entry is a device node or FIFO; layers cannot hold them"},
	{CodeTarUnsupportedType, ClassInvalid, "an archive entry has a type layers cannot hold"},
	{CodeTarPathConflict, ClassInvalid, "an archive entry conflicts with another's path, e.g. a file named as the root"},
	{CodeTarXattr, ClassInvalid, "an archive entry's xattr cannot be carried by EROFS or steers overlayfs"},
	{CodeBlobNotFound, ClassNotFound, "no blob by that digest"},
	{CodeInvalidDigest, ClassInvalid, "a digest is not sha256:<64 hex digits>"},
	{CodeDigestMismatch, ClassInvalid, "a blob's content does not have its digest"},
	{CodeInvalidRange, ClassInvalid, "a blob's byte range is not valid"},
	{CodeInvalidChunkIndex, ClassInvalid, "a blob's chunk index is not valid (its digest, size, chunk size or chunk digests)"},
	{CodeChunkCorrupt, ClassInternal, "a chunk of a blob read from the store does not match its digest in the chunk index"},
	{CodeChunkFetchTimeout, ClassDeadlineExceeded, "a chunk of a blob was not read from the store in time"},
	{CodeLazyBlobExists, ClassConflict, "the node serves the blob on demand already, with another chunk index"},
	{CodeLazyCacheLocked, ClassConflict, "another on-demand blob server uses the chunk cache directory"},
	{CodeLazyBlobsClosed, ClassUnavailable, "the node's on-demand blob server is closed"},

	// Trajectories: the log of a rollout, resume, snapshots and forks.
	{CodeInvalidTrajectoryID, ClassInvalid, "a trajectory ID is not 1-200 bytes of letters, digits and -_./: without \"..\" or a leading or trailing \"/\""},
	{CodeTrajectoryNotFound, ClassNotFound, "no trajectory by that ID"},
	{CodeTrajectoryExists, ClassConflict, "a trajectory by that ID exists already"},
	{CodeTrajectoryFull, ClassTooLarge, "the trajectory holds its maximum of bytes; the step was not run or not logged"},
	{CodeTrajectoryChanged, ClassConflict, "the trajectory was changed concurrently (another writer appended or updated it)"},
	{CodeTrajectoryRunning, ClassConflict, "a running sandbox records to the trajectory: it cannot be resumed"},
	{CodeTrajectoryInFlight, ClassUnavailable, "the command was running when its sandbox's node was lost; it is not logged as done: retry it"},
	{CodeInvalidForkCount, ClassInvalid, "a fork count is below 1 or above the server's maximum"},
	{CodeSnapshotNotFound, ClassNotFound, "no snapshot by that ID"},
	{CodeSecretEnvMissing, ClassInvalid, "a resume lacks the value of a secret environment variable the create named"},
	{CodeInvalidOnDivergence, ClassInvalid, "on_divergence is not \"stop\" or \"continue\""},
	{CodeReplayDiverged, ClassConflict, "a replayed step's result differs from the logged one; the sandbox was kept where it diverged"},
	{CodeNoTrajectoryStore, ClassUnsupported, "the server keeps no trajectories (it runs without a trajectory store)"},
	{CodeStateFreezeFailed, ClassUnavailable, "the guest could not freeze its writable disk for a snapshot; nothing was stored and the sandbox runs on"},
	{CodeStateFreezeExpired, ClassUnavailable, "the snapshot outlasted the guest's freeze limit (2 minutes) and the guest thawed its disk; nothing was stored"},
	{CodeStateInvalid, ClassInternal, "the guest's listing or content of its writable state is not valid (a bad path, type, size or owner); nothing was stored"},
	{CodeSnapshotTooLarge, ClassTooLarge, "the guest's writable state holds more bytes than its disk size; nothing was stored"},

	// Networks.
	{CodeInvalidNetworkPolicy, ClassInvalid, "a network policy is not valid"},
	{CodeInvalidNetworkOptions, ClassInvalid, "the node's network options are not valid"},
	{CodeNetworkHostUnresolved, ClassInvalid, "an allowed host name does not resolve"},
	{CodeNetworkNotFound, ClassNotFound, "the sandbox has no network"},
	{CodeNetworkExists, ClassConflict, "the sandbox already has a network"},
	{CodeNetworkBusy, ClassConflict, "the sandbox's network is being created"},
	{CodeNetworkRangeExhausted, ClassUnavailable, "no free address in the node's network range"},
	{CodeNetworkManagerRunning, ClassConflict, "another network manager by that name runs on the node"},
	{CodeNetworkClosed, ClassUnavailable, "the node's network manager is closed"},

	// Cgroups.
	{CodeInvalidCgroupParent, ClassInvalid, "the cgroup parent is not a relative path of plain names"},
	{CodeInvalidCgroupID, ClassInvalid, "a cgroup name is not a plain name"},
	{CodeInvalidLimits, ClassInvalid, "cgroup limits are not valid"},
	{CodeCgroupsClosed, ClassUnavailable, "the node's cgroup manager is closed"},
}
