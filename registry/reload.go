package registry

// RuleReloader is implemented by layers whose [[rule]] tables may change
// while the stack is mounted: on SIGHUP, cairn mount reads the spec again
// and gives each such layer its rules. An error keeps the old rules (and is
// logged).
type RuleReloader interface {
	ReloadRules(Rules) error
}
