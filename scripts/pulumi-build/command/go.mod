// Wrapper module used by scripts/install-pulumi to build the pulumi-command
// resource provider (plugin "command" v1.2.1) from the Go module proxy.
//
// The provider module has no tags of its own (the repo tags v1.2.1 at its
// root), so it is pinned by the pseudo-version of the v1.2.1 release commit
// 7f3eb6f3b77cd0fa3895ba437a695dd393f7dd25 (2026-03-03T23:59:22Z).
// The version string is injected with
//   -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=1.2.1
module kimipd.local/pulumi-build/command

go 1.26

require github.com/pulumi/pulumi-command/provider v0.0.0-20260303235922-7f3eb6f3b77c

tool github.com/pulumi/pulumi-command/provider/cmd/pulumi-resource-command
