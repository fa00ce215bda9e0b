"""Human labelling shared by both methods: the label store (``label_store``), agreement
(``agreement``) and the loopback labelling form server (``form_server``). Each method's own
screens live in its package (``refusalbench.audit_screens``, ``knowornot.label_screens``). Imports core."""
