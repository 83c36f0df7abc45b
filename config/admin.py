"""Every admin page of the site deletes within bounds (config/admin_delete.py), the users' and
groups' pages too."""

from django.contrib import admin
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from config.admin_delete import BoundedDeleteMixin, delete_selected

# Replaces Django's action of the same name on every model's changelist.
admin.site.add_action(delete_selected, "delete_selected")

User = get_user_model()
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class UserAdmin(BoundedDeleteMixin, auth_admin.UserAdmin):
    pass


@admin.register(Group)
class GroupAdmin(BoundedDeleteMixin, auth_admin.GroupAdmin):
    pass
