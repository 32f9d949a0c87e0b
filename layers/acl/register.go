package acl

import (
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:      "acl",
		Summary:   "access rules beyond the mode bits, by user, group, process, path and operation (Aclfs)",
		MinLowers: 1, MaxLowers: 1,
		Options: []registry.Option{
			{Name: "default", Kind: registry.String, Default: "allow", Allowed: []string{"allow", "deny"},
				Help: "what applies when no rule does"},
			{Name: "log_denials", Kind: registry.Bool, Default: false, Help: "log each refused operation (a warning)"},
			{Name: "reload", Kind: registry.Bool, Default: false,
				Help: "the rules may change while mounted (SIGHUP reads them again); open files are then checked on each read and write, without kernel passthrough"},
		},
		Rules: &registry.RuleSpec{
			Help: "the first rule that covers the path and matches the caller and the operation allows or denies it",
			Options: []registry.Option{
				{Name: "action", Kind: registry.String, Required: true, Allowed: []string{"allow", "deny"}, Help: "allow or deny"},
				{Name: "users", Kind: registry.List, Help: "callers by uid or user name (default: anyone)", Check: registry.Each(registry.UserID)},
				{Name: "groups", Kind: registry.List, Help: "callers in one of these groups, by gid or name, supplementary groups included", Check: registry.Each(registry.GroupID)},
				{Name: "procs", Kind: registry.List, Help: "callers by the program the kernel ran for them: a path, or a name looked up in PATH when the rules are loaded; matched by device and inode of /proc/PID/exe, not by the name a process gives itself", Check: registry.Each(program)},
				{Name: "ops", Kind: registry.List,
					Help: "operation classes: read, write, create, delete, rename, setattr, xattr, exec (default: all); a rename is also a delete of the old name and a create of the new one (and a write of a file it replaces); reading refused refuses exec too, unless the allowing rule names exec", Check: registry.Each(class)},
			},
		},
		NoPassthrough: func(o registry.Values) string {
			if o.Bool("reload") {
				return "reload = true: open files are checked on each read and write"
			}
			return ""
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			rs, err := FromRegistry(o.Rules(), o.String("default") == "allow")
			if err != nil {
				return nil, err
			}
			return New(l[0], rs, o.Bool("reload"), o.Bool("log_denials")), nil
		},
	})
}
