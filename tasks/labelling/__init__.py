"""Human labels shared by both methods: the label store, the loopback labelling form, the screens. Imports core."""
